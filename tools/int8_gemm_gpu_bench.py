#!/usr/bin/env python
"""The W8A8 int8 GEMM's two paths at the models' linear-layer shapes: cuBLAS ``torch._int_mm`` with the fp32 scale
and bias epilogue, the Triton kernel at its planned tiles, and bf16 ``torch.mm`` as the baseline.

    python tools/int8_gemm_gpu_bench.py OUT_DIR           # pi0 / pi0.5 / GR00T N1.6 shapes, batch 1 and 8, CUDA
    python tools/int8_gemm_gpu_bench.py --cpu OUT_DIR     # the tiny presets on the CPU (Triton interpreted), seconds

Shapes from the presets (models/pi0/config.py, models/groot/config.py): every Gemma / Qwen3 tower's QKV, output,
gate+up and down projections, at ``batch x tokens`` rows (the action expert / DiT: the action chunk; the VLM /
LLM: a 3-view prefix of 256 patches each plus the prompt). Each path is timed with CUDA events (median of runs
after warm-up); a path that does not take a shape (``_int_mm``: 16 rows or fewer, K or N not a multiple of 8)
is reported as such. One JSON file ``int8_gemm_<time>.json`` in OUT_DIR, one line per shape on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def tower_shapes(tower) -> list[tuple[str, int, int]]:
    """``(layer, K, N)`` of one transformer tower's linear layers."""
    d, hd = tower.width, tower.head_dim
    return [
        ("qkv", d, (tower.num_heads + 2 * tower.num_kv_heads) * hd),
        ("o", tower.num_heads * hd, d),
        ("gate_up", d, 2 * tower.mlp_dim),
        ("down", tower.mlp_dim, d),
    ]


def model_shapes(cpu: bool) -> list[tuple[str, str, int, int, int]]:
    """``(model, layer, tokens per sample, K, N)`` from the presets (the tiny ones with ``cpu``)."""
    from embodied_accel.models.groot.config import get_preset as groot_preset
    from embodied_accel.models.pi0.config import get_preset as pi0_preset

    out = []
    for name in ("pi0-tiny", "pi05-tiny") if cpu else ("pi0", "pi05"):
        config = pi0_preset(name)
        prefix = 3 * 256 + config.max_token_len
        for layer, k, n in tower_shapes(config.vlm):
            out.append((name, f"vlm.{layer}", prefix, k, n))
        for layer, k, n in tower_shapes(config.expert):
            out.append((name, f"expert.{layer}", config.action_horizon + 1, k, n))
    groot = groot_preset("groot-tiny" if cpu else "groot-n1.6")
    for layer, k, n in tower_shapes(groot.llm):
        out.append((groot.name, f"llm.{layer}", 3 * 256, k, n))
    return out


def timed(fn, runs: int, warmup: int, device: str) -> float:
    """Median milliseconds of ``fn()``."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--cpu", action="store_true", help="tiny presets on the CPU (Triton interpreted)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args(argv)
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from embodied_accel.ops.cuda import int8_gemm

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device; --cpu runs the tiny shapes on the CPU")
    runs, warmup = (2, 1) if args.cpu else (50, 10)
    rows = []
    seen: dict[tuple[int, int, int], dict] = {}
    for model, layer, tokens, k, n in model_shapes(args.cpu):
        for batch in args.batches:
            m = batch * (tokens if not args.cpu else min(tokens, 24))
            if (m, k, n) in seen:  # pi0.5's towers are pi0's: timed once, listed under both
                seen[m, k, n]["same_shape"].append(f"{model} {layer}")
                continue
            gen = torch.Generator().manual_seed(m + k + n)
            x_q = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8).to(device)
            w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).to(device).t()
            xs, ws = torch.rand(m, device=device), torch.rand(n, device=device)
            bias = torch.randn(n, device=device, dtype=torch.bfloat16)
            x16, w16 = torch.randn(m, k, device=device, dtype=torch.bfloat16), torch.randn(k, n, device=device, dtype=torch.bfloat16)
            path, reason = int8_gemm.choose_path(x_q, w_q)
            row = {"model": model, "layer": layer, "batch": batch, "m": m, "k": k, "n": n, "chosen": path,
                   "tiles": list(int8_gemm.tile_config(m)),
                   "bf16_mm_ms": timed(lambda: torch.mm(x16, w16), runs, warmup, device),
                   "triton_ms": timed(lambda: int8_gemm.triton_linear(x_q, xs, w_q, ws, bias, torch.bfloat16),
                                      runs, warmup, device),
                   "int_mm_ms": None, "int_mm_refused": reason, "same_shape": []}  # fmt: skip
            seen[m, k, n] = row
            if reason is None:
                row["int_mm_ms"] = timed(lambda: int8_gemm.int_mm_linear(x_q, xs, w_q, ws, bias, torch.bfloat16),
                                         runs, warmup, device)  # fmt: skip
            rows.append(row)
            int_mm = f"{row['int_mm_ms']:.4f} ms" if reason is None else f"refused ({reason})"
            print(f"{model} {layer} batch {batch} [{m}x{k}x{n}]: bf16 mm {row['bf16_mm_ms']:.4f} ms, "
                  f"triton {row['triton_ms']:.4f} ms, _int_mm {int_mm}; chosen {path}", flush=True)  # fmt: skip
    record = {
        "kind": "int8_gemm",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "runs": runs,
        "warmup": warmup,
        "rows": rows,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"int8_gemm_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
