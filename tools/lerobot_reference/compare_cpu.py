#!/usr/bin/env python
"""LeRobot 0.6.1 pi0 / pi0.5 against embodied_accel, side by side in ONE process, on CPU.

A benchmark, not a test: CI does not run it.  Run it with the Python that has ``lerobot[pi]==0.6.1``
(``embodied_accel`` is imported from this checkout, no install needed)::

    V/bin/python tools/lerobot_reference/compare_cpu.py --config tiny                  # both families, b1 + b2
    V/bin/python tools/lerobot_reference/compare_cpu.py --config full --family pi0     # ~17 GiB RAM
    V/bin/python tools/lerobot_reference/compare_cpu.py --config full --family pi05

Both implementations run under the same torch, with the same ``torch.set_num_threads(--threads)``.
For each one and each batch it records:

* aten ops per call: every op that reaches a ``TorchDispatchMode`` during one ``sample_actions``
  call, after warm-up; the ops inside the denoising loop (LeRobot: inside ``euler_integrate``;
  ours: inside ``Pi0Model.denoise``) and per denoising step (inside ``denoise_step``);
* wall time per call (mean, p50, min, max, std) over ``--runs`` calls after warm-up;
* process RSS (``/proc/self/status``; peak via ``/proc/self/clear_refs``);
* the largest absolute difference between the two outputs.

``--config tiny``: the reduced models of the parity fixtures ``tests/fixtures/pi0{,5}_tiny``.  LeRobot's
policy is built exactly as ``make_fixtures.py`` builds it and loaded strictly from the fixture's
``model.safetensors``; ours is ``load_policy(fixture_dir, preset="pi0-tiny" | "pi05-tiny")``.  The
inputs are the fixture's (batch 2) and their first row (batch 1).  Calls are interleaved
(LeRobot, ours, LeRobot, ours, ...) so that machine noise hits both alike.

``--config full``: LeRobot's full-size policy (PaliGemma 2B + Gemma 300M, fp32, LeRobot's own random
init), ``save_pretrained`` to ``--workdir`` with its pre/post-processors (seeded dataset stats), timed
on one synthetic observation; its output is saved; then the LeRobot model is deleted (both do not
fit in 24 GiB) before ours is loaded from ``--workdir`` and timed on the same inputs.
``--smoke-tiny`` runs this same path with the tiny models (seconds), to check the code path.

One JSON file is written: ``<out>/<date>_lerobot_vs_ours_<config>_<family>_cpu.json``.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import platform
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # make_fixtures (LeRobot tiny build)
sys.path.insert(0, str(REPO_ROOT))  # embodied_accel from this checkout

import make_fixtures as mf
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

import embodied_accel
from embodied_accel import load_policy
from embodied_accel.models.pi0.processor import ModelInputs, compact_inputs

FIXTURES = REPO_ROOT / "tests" / "fixtures"
DEFAULT_OUT = REPO_ROOT / "bench" / "results"
FAMILIES = ("pi0", "pi05")
IMPLS = ("lerobot", "ours")
FULL_VALID_TOKENS = 20
FULL_SEED = 1234
MB = 1024.0 * 1024.0


# --------------------------------------------------------------------------------------
# Process memory
# --------------------------------------------------------------------------------------
def _proc_kb(path: str, field: str) -> int | None:
    """A ``Field:  N kB`` line of a /proc file, in kB."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _status_kb(field: str) -> int | None:
    return _proc_kb("/proc/self/status", field)


def rss_mb() -> float | None:
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 1024.0


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    kb = _status_kb("VmHWM")
    return None if kb is None else kb / 1024.0


def release_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------
# Op counting
# --------------------------------------------------------------------------------------
class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched, in total and inside named regions (wrapped callables)."""

    def __init__(self):
        super().__init__()
        self.total = 0
        self.hist: collections.Counter = collections.Counter()
        self.depth: collections.Counter = collections.Counter()
        self.region_ops: collections.Counter = collections.Counter()
        self.region_calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        self.hist[str(func.overloadpacket)] += 1
        for region, d in self.depth.items():
            if d:
                self.region_ops[region] += 1
        return func(*args, **(kwargs or {}))


def _wrap(counter: OpCounter, owner: Any, attr: str, region: str) -> Callable[[], None]:
    """Replace ``owner.attr`` by a wrapper that marks ``region``; returns the undo function."""
    had_own = attr in vars(owner)
    orig_own = vars(owner).get(attr)
    orig = getattr(owner, attr)

    def wrapped(*a, **k):
        counter.region_calls[region] += 1
        counter.depth[region] += 1
        try:
            return orig(*a, **k)
        finally:
            counter.depth[region] -= 1

    setattr(owner, attr, wrapped)

    def undo():
        if had_own:
            setattr(owner, attr, orig_own)
        else:
            delattr(owner, attr)

    return undo


def count_ops(
    call: Callable[[], torch.Tensor], regions: list[tuple[Any, str, str]]
) -> tuple[torch.Tensor, dict]:
    """One call under an :class:`OpCounter`; ``regions``: ``(owner, attr, "loop" | "step")``."""
    counter = OpCounter()
    undos = [_wrap(counter, owner, attr, region) for owner, attr, region in regions]
    try:
        with counter:
            out = call()
    finally:
        for undo in reversed(undos):
            undo()
    steps = counter.region_calls["step"]
    return out, {
        "aten_ops_per_call": counter.total,
        "aten_ops_in_denoising_loop": counter.region_ops["loop"],
        "aten_ops_outside_denoising_loop": counter.total - counter.region_ops["loop"],
        "denoise_step_calls": steps,
        "aten_ops_in_denoise_steps": counter.region_ops["step"],
        "aten_ops_per_denoise_step": counter.region_ops["step"] / steps
        if steps
        else None,
        "aten_op_histogram": dict(
            sorted(counter.hist.items(), key=lambda kv: (-kv[1], kv[0]))
        ),
    }


# --------------------------------------------------------------------------------------
# The two implementations
# --------------------------------------------------------------------------------------
#: Where "ops in the loop" and "ops per step" are counted, on each side.
OP_REGIONS = {
    "ops_loop_region": {"lerobot": "flow_matching.euler_integrate", "ours": "Pi0Model.denoise"},
    "ops_step_region": {"lerobot": "PI0Pytorch/PI05Pytorch.denoise_step", "ours": "Pi0Model.denoise_step"},
}


class Impl:
    """One implementation bound to one set of inputs: ``call()`` runs ``sample_actions`` once."""

    def __init__(
        self,
        name: str,
        call: Callable[[], torch.Tensor],
        regions: list[tuple[Any, str, str]],
    ):
        self.name, self.call, self.regions = name, call, regions


def lerobot_impl(policy, family: str, x: dict[str, torch.Tensor]) -> Impl:
    mod = mf.modeling_pi0 if family == "pi0" else mf.modeling_pi05
    n = x["images"].shape[1]
    # LeRobot takes one [B, 3, H, W] tensor per camera (contiguous, as its _preprocess_images makes them)
    images = [x["images"][:, i].contiguous() for i in range(n)]
    masks = [x["image_masks"][:, i].contiguous() for i in range(n)]
    args = [images, masks, x["tokens"], x["token_masks"]]
    if family == "pi0":
        args.append(x["state"])
    model, noise = policy.model, x["noise"]

    def call():
        return model.sample_actions(*args, noise=noise)

    return Impl(
        "lerobot",
        call,
        [(mod, "euler_integrate", "loop"), (model, "denoise_step", "step")],
    )


def ours_impl(policy, family: str, x: dict[str, torch.Tensor], compact: bool = True) -> Impl:
    """Ours on the same inputs. ``compact`` (the library's own path, ``policy.prepare``): camera slots
    missing from every row and prompt padding are dropped before the call (exact, host-side);
    otherwise the model runs on LeRobot's exact shapes."""
    model = policy.model
    state = x["state"] if family == "pi0" else torch.zeros(x["tokens"].shape[0], 32)
    inputs = ModelInputs(x["images"], x["image_masks"], x["tokens"], x["token_masks"], state)
    if compact:
        inputs = compact_inputs(inputs, policy.token_bucket)
    noise = x["noise"]

    def call():
        return policy.sample(inputs, noise)

    return Impl(
        "ours", call, [(model, "denoise", "loop"), (model, "denoise_step", "step")]
    )


def load_ours(checkpoint_dir: Path, preset: str | None):
    return load_policy(
        str(checkpoint_dir),
        preset=preset,
        backend="reference",
        dtype="float32",
        device="cpu",
        progress=False,
    )


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------
def stats_ms(times: list[float], warmup: int) -> dict:
    ms = np.asarray(times, dtype=np.float64) * 1e3
    return {
        "warmup_calls": warmup,
        "runs": len(times),
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "std_ms": float(ms.std(ddof=1)) if ms.size > 1 else 0.0,
        "times_ms": [round(float(t), 3) for t in ms],
    }


def time_interleaved(impls: list[Impl], warmup: int, runs: int) -> dict[str, dict]:
    """A B A B ...: each round calls every implementation once."""
    for _ in range(warmup):
        for impl in impls:
            impl.call()
    times: dict[str, list[float]] = {impl.name: [] for impl in impls}
    for _ in range(runs):
        for impl in impls:
            t0 = time.perf_counter()
            impl.call()
            times[impl.name].append(time.perf_counter() - t0)
    return {name: stats_ms(t, warmup) for name, t in times.items()}


def time_sequential(impl: Impl, warmup: int, runs: int) -> tuple[dict, list[float]]:
    first: list[float] = []
    for _ in range(warmup):
        t0 = time.perf_counter()
        impl.call()
        first.append(time.perf_counter() - t0)
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        impl.call()
        times.append(time.perf_counter() - t0)
        print(f"  {impl.name} run {i + 1}/{runs}: {times[-1] * 1e3:.1f} ms", flush=True)
    return stats_ms(times, warmup), first


def call_peak_rss(impl: Impl) -> dict:
    """RSS before one call and the process's peak RSS during it (MiB)."""
    release_memory()
    before = rss_mb()
    if not reset_peak_rss():
        return {
            "rss_before_call_mb": before,
            "peak_rss_during_call_mb": None,
            "peak_rss_call_delta_mb": None,
        }
    impl.call()
    peak = peak_rss_mb()
    return {
        "rss_before_call_mb": before,
        "peak_rss_during_call_mb": peak,
        "peak_rss_call_delta_mb": None
        if peak is None or before is None
        else peak - before,
    }


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def ratios(lr: dict, ours: dict) -> dict:
    keys = (
        "mean_ms",
        "p50_ms",
        "min_ms",
        "aten_ops_per_call",
        "aten_ops_in_denoising_loop",
        "aten_ops_outside_denoising_loop",
        "aten_ops_per_denoise_step",
    )
    return {k: _ratio(ours.get(k), lr.get(k)) for k in keys}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


# --------------------------------------------------------------------------------------
# Environment stamp
# --------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            check=False,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(threads: int) -> dict:
    import lerobot
    import transformers

    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": cpu_model(),
        "device_type": "cpu",
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch_num_threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "lerobot": lerobot.__version__,
            "transformers": transformers.__version__,
            "embodied_accel": embodied_accel.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "mem_total_mb": (_meminfo_kb("MemTotal") or 0) / 1024.0 or None,
        "loadavg_start": _loadavg(),
    }


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _meminfo_kb(field: str) -> int | None:
    return _proc_kb("/proc/meminfo", field)


def write_json(record: dict, out_dir: Path, config: str, family: str) -> Path:
    record["loadavg_end"] = (
        _loadavg()
    )  # 1/5/15-min load averages: a busy machine makes the timings noisy
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromisoformat(record["date"]).strftime("%Y%m%dT%H%M%SZ")
    if record.get("settings", {}).get("same_shapes"):
        config += "-same-shapes"
    path = out_dir / f"{stamp}_lerobot_vs_ours_{config}_{family}_cpu.json"
    suffix = 2
    while path.exists():
        path = out_dir / f"{stamp}_lerobot_vs_ours_{config}_{family}_cpu-{suffix}.json"
        suffix += 1
    path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    return path


# --------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------
def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(rows: list[tuple[str, int, dict]]) -> None:
    """rows: (family, batch, entry) where entry has "lerobot", "ours", "ratio_ours_over_lerobot", diff."""
    head = (
        f"{'family':<6} {'b':>2} {'impl':<8} {'mean ms':>9} {'p50 ms':>9} {'min ms':>9} {'ops/call':>9} "
        f"{'ops loop':>9} {'ops/step':>9} {'peakΔ MB':>9} {'max|diff|':>10}"
    )
    print(head)
    print("-" * len(head))
    for family, batch, e in rows:
        for name in IMPLS:
            r = e[name]
            diff = (
                _fmt(e["max_abs_diff_ours_vs_lerobot"], ".2e") if name == "ours" else ""
            )
            print(
                f"{family:<6} {batch:>2} {name:<8} {_fmt(r['mean_ms'], '9.2f')} {_fmt(r['p50_ms'], '9.2f')} "
                f"{_fmt(r['min_ms'], '9.2f')} {_fmt(r['aten_ops_per_call'], '9d')} "
                f"{_fmt(r['aten_ops_in_denoising_loop'], '9d')} {_fmt(r['aten_ops_per_denoise_step'], '9.1f')} "
                f"{_fmt(r.get('peak_rss_call_delta_mb'), '9.1f')} {diff:>10}"
            )
        q = e["ratio_ours_over_lerobot"]
        print(
            f"{family:<6} {batch:>2} {'ratio':<8} {_fmt(q['mean_ms'], '9.3f')} {_fmt(q['p50_ms'], '9.3f')} "
            f"{_fmt(q['min_ms'], '9.3f')} {_fmt(q['aten_ops_per_call'], '9.3f')} "
            f"{_fmt(q['aten_ops_in_denoising_loop'], '9.3f')} {_fmt(q['aten_ops_per_denoise_step'], '9.3f')}"
        )
    print(
        "ratio = ours / LeRobot (lower is better). ops loop: LeRobot euler_integrate, ours Pi0Model.denoise."
    )


def _impl_entry(timing: dict, ops: dict, rss: dict, hist_top: int) -> dict:
    ops = dict(ops)
    hist = ops.pop("aten_op_histogram")
    entry = {**timing, **ops, **rss}
    entry["aten_op_histogram"] = (
        dict(list(hist.items())[:hist_top]) if hist_top else hist
    )
    return entry


# --------------------------------------------------------------------------------------
# --config tiny
# --------------------------------------------------------------------------------------
def tiny_inputs(
    io: dict[str, torch.Tensor], family: str, batch: int
) -> dict[str, torch.Tensor]:
    names = ["images", "image_masks", "tokens", "token_masks", "noise"] + (
        ["state"] if family == "pi0" else []
    )
    return {k: io[k][:batch].contiguous() for k in names}


def run_tiny(args) -> None:
    mf.install_patches()
    families = FAMILIES if args.family == "both" else (args.family,)
    env = environment(args.threads)
    results: dict[str, Any] = {}
    rows = []
    for family in families:
        fixture = FIXTURES / mf.POLICIES[family]["dir"]
        io = load_file(fixture / "io.safetensors")
        print(f"=== {family}: {fixture}", flush=True)

        release_memory()
        rss0 = rss_mb()
        t0 = time.perf_counter()
        lr_policy = mf.build_policy(
            family, 0
        )  # seed irrelevant: every weight comes from the file
        missing, unexpected = lr_policy.load_state_dict(
            load_file(fixture / "model.safetensors"), strict=True
        )
        assert not missing and not unexpected
        lr_load_s = time.perf_counter() - t0
        release_memory()
        rss1 = rss_mb()
        t0 = time.perf_counter()
        ours_policy = load_ours(fixture, f"{family}-tiny")
        ours_load_s = time.perf_counter() - t0
        release_memory()
        rss2 = rss_mb()
        load = {
            "lerobot": {"load_s": lr_load_s, "rss_load_delta_mb": rss1 - rss0},
            "ours": {"load_s": ours_load_s, "rss_load_delta_mb": rss2 - rss1},
        }

        fam_res: dict[str, Any] = {
            "fixture": str(fixture.relative_to(REPO_ROOT)),
            "load": load,
        }
        for batch in args.batches:
            x = tiny_inputs(io, family, batch)
            impls = [
                lerobot_impl(lr_policy, family, x),
                ours_impl(ours_policy, family, x, compact=not args.same_shapes),
            ]
            # ops of the very first call at this batch size (ours allocates caches then), then warm
            cold = {
                impl.name: count_ops(impl.call, impl.regions)[1]["aten_ops_per_call"]
                for impl in impls
            }
            timing = time_interleaved(impls, args.warmup, args.runs)
            outs, ops, rss = {}, {}, {}
            for impl in impls:
                outs[impl.name], ops[impl.name] = count_ops(impl.call, impl.regions)
                ops[impl.name]["aten_ops_first_call"] = cold[impl.name]
                rss[impl.name] = call_peak_rss(impl)
            entry: dict[str, Any] = {
                name: _impl_entry(timing[name], ops[name], rss[name], args.hist_top)
                for name in IMPLS
            }
            entry["ratio_ours_over_lerobot"] = ratios(entry["lerobot"], entry["ours"])
            entry["max_abs_diff_ours_vs_lerobot"] = max_abs_diff(
                outs["ours"], outs["lerobot"]
            )
            ref = io["actions_model"][:batch]
            entry["max_abs_diff_lerobot_vs_fixture"] = max_abs_diff(
                outs["lerobot"], ref
            )
            entry["max_abs_diff_ours_vs_fixture"] = max_abs_diff(outs["ours"], ref)
            entry["output_shape"] = list(outs["ours"].shape)
            fam_res[f"batch{batch}"] = entry
            rows.append((family, batch, entry))
            print(
                f"  b{batch}: lerobot {entry['lerobot']['mean_ms']:.2f} ms, ours {entry['ours']['mean_ms']:.2f} ms, "
                f"max|diff| {entry['max_abs_diff_ours_vs_lerobot']:.2e}",
                flush=True,
            )
        results[family] = fam_res
        del lr_policy, ours_policy, impls
        release_memory()

    record = dict(
        benchmark="lerobot_vs_ours_cpu",
        config="tiny",
        families=list(families),
        **env,
        settings={
            "warmup_calls": args.warmup,
            "runs": args.runs,
            "interleaved": True,
            "same_shapes": args.same_shapes,
            "batches": list(args.batches),
            "backend": "reference",
            "dtype": "float32",
            "num_steps": 10,
            "call": {
                "lerobot": "policy.model.sample_actions([images[:, i]], [image_masks[:, i]], tokens, token_masks"
                "[, state], noise=noise)",
                "ours": "policy.sample(compact_inputs(ModelInputs(images, image_masks, tokens, token_masks, state)), noise)",
            },
            **OP_REGIONS,
            "rss_note": "process-wide RSS; both implementations live in the same process",
        },
        results=results,
    )
    print()
    print(
        f"CPU: {env['device']}, torch {env['versions']['torch']}, threads {args.threads}"
    )
    print_table(rows)
    path = write_json(record, args.out, "tiny", "-".join(families))
    print(f"wrote {path}")


# --------------------------------------------------------------------------------------
# --config full
# --------------------------------------------------------------------------------------
def full_inputs(
    family: str, cfg, vocab: int, batch: int = 1
) -> dict[str, torch.Tensor]:
    """One synthetic observation: 3 cameras (the third missing: -1, mask False), ~20 valid tokens."""
    gen = torch.Generator().manual_seed(FULL_SEED)
    h, w = cfg.image_resolution
    images = torch.rand((batch, 3, 3, h, w), generator=gen) * 2 - 1
    images[:, 2] = -1.0
    image_masks = torch.tensor([[True, True, False]] * batch)
    length = cfg.tokenizer_max_length
    tokens = torch.randint(1, vocab, (batch, length), generator=gen, dtype=torch.int64)
    token_masks = torch.zeros((batch, length), dtype=torch.bool)
    token_masks[:, :FULL_VALID_TOKENS] = True
    tokens = torch.where(token_masks, tokens, torch.zeros_like(tokens))
    noise = torch.randn((batch, cfg.chunk_size, cfg.max_action_dim), generator=gen)
    x = {
        "images": images,
        "image_masks": image_masks,
        "tokens": tokens,
        "token_masks": token_masks,
        "noise": noise,
    }
    if family == "pi0":
        state = torch.zeros((batch, cfg.max_state_dim))
        state[:, : mf.STATE_DIM] = (
            torch.randn((batch, mf.STATE_DIM), generator=gen) * 0.5
        )
        x["state"] = state
    return x


def _build_lerobot_full(family: str, seed: int):
    torch.manual_seed(seed)
    cfg = mf.make_config(
        family
    )  # the fixtures' settings: 3 cameras, state 8, action 7, fp32, 10 steps
    cls = mf.modeling_pi0.PI0Policy if family == "pi0" else mf.modeling_pi05.PI05Policy
    policy = cls(cfg)
    policy.eval()
    return policy


def _measure_full_side(
    impl: Impl, warmup: int, runs: int, hist_top: int
) -> tuple[torch.Tensor, dict]:
    release_memory()
    rss_before = rss_mb()
    can_peak = reset_peak_rss()
    timing, first = time_sequential(impl, warmup, runs)
    out, ops = count_ops(impl.call, impl.regions)
    peak = peak_rss_mb() if can_peak else None
    rss = {
        "rss_before_calls_mb": rss_before,
        "peak_rss_during_calls_mb": peak,
        "peak_rss_call_delta_mb": None
        if peak is None or rss_before is None
        else peak - rss_before,
    }
    entry = _impl_entry(timing, ops, rss, hist_top)
    entry["warmup_times_ms"] = [round(t * 1e3, 3) for t in first]
    return out, entry


def run_full(args) -> None:
    family = args.family
    if family not in FAMILIES:
        raise SystemExit("--config full needs --family pi0 or --family pi05")
    smoke = args.smoke_tiny
    if smoke:
        mf.install_patches()  # the tiny models (and the offline tokenizer stub): checks this code path quickly
    else:
        mf.tokenizer_processor.AutoTokenizer = mf._OfflineAutoTokenizer
    workdir = args.workdir or Path.home() / ".cache" / "embodied_accel" / f"lerobot_full_{family}"
    workdir.mkdir(parents=True, exist_ok=True)
    env = environment(args.threads)
    avail = _meminfo_kb("MemAvailable")
    if not smoke and avail is not None and avail < 20 * 1024 * 1024:
        print(
            f"WARNING: only {avail / 1024 / 1024:.1f} GiB available; the LeRobot build needs about 17 GiB"
        )
    print(
        f"=== {family} {'(SMOKE: tiny models)' if smoke else 'full size'} -> {workdir}",
        flush=True,
    )

    # ---- LeRobot: build (random init), save, time
    release_memory()
    rss0 = rss_mb()
    can_peak = reset_peak_rss()
    t0 = time.perf_counter()
    policy = _build_lerobot_full(family, args.seed)
    build_s = time.perf_counter() - t0
    build_peak = peak_rss_mb() if can_peak else None
    rss1 = rss_mb()
    n_params = sum(p.numel() for p in policy.parameters())
    cfg = policy.config
    vocab = policy.model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight.shape[
        0
    ]
    print(
        f"LeRobot {type(policy).__name__}: {n_params / 1e6:.1f} M parameters, built in {build_s:.1f} s, "
        f"RSS {rss1:.0f} MiB",
        flush=True,
    )

    t0 = time.perf_counter()
    policy.save_pretrained(workdir)
    stats_gen = torch.Generator().manual_seed(FULL_SEED + 1)
    stats = {
        "observation.state": mf.make_stats(stats_gen, mf.STATE_DIM),
        "action": mf.make_stats(stats_gen, mf.ACTION_DIM),
    }
    from lerobot.policies.factory import make_pre_post_processors

    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    pre.save_pretrained(workdir)
    post.save_pretrained(workdir)
    save_s = time.perf_counter() - t0
    print(f"saved to {workdir} in {save_s:.1f} s", flush=True)

    x = full_inputs(family, cfg, vocab)
    save_file(
        {k: v.contiguous() for k, v in x.items()},
        workdir / "compare_inputs.safetensors",
    )
    lr_impl = lerobot_impl(policy, family, x)
    lr_out, lr_entry = _measure_full_side(
        lr_impl, args.warmup, args.runs, args.hist_top
    )
    save_file(
        {"actions_model": lr_out.contiguous()},
        workdir / "compare_lerobot_actions.safetensors",
    )
    lr_entry.update(
        build_s=build_s,
        save_s=save_s,
        rss_load_delta_mb=rss1 - rss0,
        peak_rss_build_mb=build_peak,
        parameters=n_params,
    )

    # ---- free LeRobot completely before loading ours (both do not fit in 24 GiB)
    ref = weakref.ref(policy)
    del lr_impl, policy, pre, post
    release_memory()
    if ref() is not None:
        print(
            f"WARNING: the LeRobot policy is still referenced ({len(gc.get_referrers(ref()))} referrers)"
        )
    rss_freed = rss_mb()
    print(f"LeRobot freed: RSS {rss_freed:.0f} MiB", flush=True)

    # ---- ours: load from the saved directory, time on the same inputs
    can_peak = reset_peak_rss()
    t0 = time.perf_counter()
    ours = load_ours(workdir, f"{family}-tiny" if smoke else None)
    load_s = time.perf_counter() - t0
    load_peak = peak_rss_mb() if can_peak else None
    release_memory()
    rss2 = rss_mb()
    print(f"ours loaded in {load_s:.1f} s, RSS {rss2:.0f} MiB", flush=True)
    ours_impl_ = ours_impl(ours, family, x)
    ours_out, ours_entry = _measure_full_side(
        ours_impl_, args.warmup, args.runs, args.hist_top
    )
    ours_entry.update(
        load_s=load_s,
        rss_load_delta_mb=rss2 - rss_freed,
        peak_rss_load_mb=load_peak,
        parameters=ours.num_parameters(),
    )

    lr_saved = load_file(workdir / "compare_lerobot_actions.safetensors")[
        "actions_model"
    ]
    entry: dict[str, Any] = {"lerobot": lr_entry, "ours": ours_entry}
    entry["ratio_ours_over_lerobot"] = ratios(lr_entry, ours_entry)
    entry["max_abs_diff_ours_vs_lerobot"] = max_abs_diff(ours_out, lr_saved)
    # ours again on LeRobot's exact shapes (nothing dropped): the pure compute comparison
    same_out, same_entry = _measure_full_side(
        ours_impl(ours, family, x, compact=False), args.warmup, args.runs, args.hist_top
    )
    entry["ours_same_shapes"] = same_entry
    entry["ratio_ours_same_shapes_over_lerobot"] = ratios(lr_entry, same_entry)
    entry["max_abs_diff_ours_same_shapes_vs_lerobot"] = max_abs_diff(same_out, lr_saved)
    print(
        f"ours on LeRobot's exact shapes (no camera/padding dropped): mean {same_entry['mean_ms']:.0f} ms, "
        f"ratio {entry['ratio_ours_same_shapes_over_lerobot']['mean_ms']:.3f}, "
        f"max|diff| {entry['max_abs_diff_ours_same_shapes_vs_lerobot']:.2e}",
        flush=True,
    )
    entry["lerobot_output_absmax"] = float(lr_saved.abs().max())
    entry["output_shape"] = list(ours_out.shape)
    config_name = "full-smoke-tiny" if smoke else "full"
    record = dict(
        benchmark="lerobot_vs_ours_cpu",
        config=config_name,
        families=[family],
        **env,
        settings={
            "warmup_calls": args.warmup,
            "runs": args.runs,
            "interleaved": False,
            "sequence": "LeRobot build, save, time; delete; ours load, time",
            "batches": [1],
            "backend": "reference",
            "dtype": "float32",
            "num_steps": cfg.num_inference_steps,
            "workdir": str(workdir),
            "inputs": {
                "seed": FULL_SEED,
                "cameras": 3,
                "present_cameras": 2,
                "missing_camera": "third: all -1, mask False",
                "tokens": cfg.tokenizer_max_length,
                "valid_tokens": FULL_VALID_TOKENS,
                "vocab": vocab,
            },
            "lerobot_weights": f"LeRobot's own random init, torch.manual_seed({args.seed})",
            **OP_REGIONS,
            "rss_note": "process RSS; the LeRobot model is deleted before ours is loaded",
        },
        results={family: {"batch1": entry}},
    )
    print()
    print(
        f"CPU: {env['device']}, torch {env['versions']['torch']}, threads {args.threads}"
    )
    print_table([(family, 1, entry)])
    print(
        f"build: LeRobot {build_s:.1f} s (peak RSS {_fmt(build_peak, '.0f')} MiB); "
        f"load: ours {load_s:.1f} s (peak RSS {_fmt(load_peak, '.0f')} MiB)"
    )
    path = write_json(record, args.out, config_name, family)
    print(f"wrote {path}")


# --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", choices=("tiny", "full"), required=True)
    ap.add_argument(
        "--same-shapes",
        action="store_true",
        help="tiny: run ours on LeRobot's exact input shapes (no missing camera or prompt padding dropped)",
    )
    ap.add_argument(
        "--family",
        choices=(*FAMILIES, "both"),
        default=None,
        help="tiny: default both; full: required (pi0 or pi05)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: 1 tiny, 2 full)",
    )
    ap.add_argument(
        "--runs", type=int, default=None, help="timed calls (default: 20 tiny, 3 full)"
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up calls (default: 3 tiny, 1 full)",
    )
    ap.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=[1, 2],
        help="tiny: batch sizes (<= 2)",
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="full: where the LeRobot checkpoint is saved (default ~/.cache/embodied_accel/lerobot_full_<family>)",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="full: torch.manual_seed before LeRobot's random init",
    )
    ap.add_argument(
        "--smoke-tiny",
        action="store_true",
        help="full: run the full-size code path with the tiny models (seconds; checks the script)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="result directory (default bench/results)",
    )
    ap.add_argument(
        "--hist-top",
        type=int,
        default=0,
        help="keep only the N commonest ops in the histograms",
    )
    args = ap.parse_args()

    tiny = args.config == "tiny"
    if args.family is None:
        if not tiny:
            ap.error("--config full needs --family pi0 or --family pi05")
        args.family = "both"
    if not tiny and args.family == "both":
        ap.error("--config full needs --family pi0 or --family pi05")
    if tiny and args.smoke_tiny:
        ap.error("--smoke-tiny goes with --config full")
    if tiny and any(b not in (1, 2) for b in args.batches):
        ap.error("--batches: the fixtures have batch 2; use 1 and/or 2")
    args.threads = args.threads or (1 if tiny else 2)
    args.runs = args.runs or (20 if tiny else 3)
    args.warmup = args.warmup if args.warmup is not None else (3 if tiny else 1)
    torch.set_num_threads(args.threads)
    (run_tiny if tiny else run_full)(args)


if __name__ == "__main__":
    main()
