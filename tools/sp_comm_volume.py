#!/usr/bin/env python
"""Communication volume of one sequence-parallel attention layer, measured (bytes each process sends) against the
formulas, for Ulysses, Ring and the hybrid, on gloo with 2 and 4 processes on the CPU.

    python tools/sp_comm_volume.py            # writes bench/results/<date>_vggt-global-attention_..._cpu.json

Per process and layer, with the sequence of ``S`` tokens of width ``h = heads * head_dim`` split over ``P``
processes (``U`` Ulysses × ``R`` Ring), ``b`` bytes per element:

* Ulysses: two all-to-alls (q, k, v in; the output back) of ``4 * S/P * h`` elements, of which a fraction
  ``(U - 1) / U`` leaves the process: ``4 * S * h * b * (P - 1) / P**2`` ≈ ``4/P * S * h * b``;
* Ring: K and V of ``S/P`` tokens sent ``R - 1`` times: ``2 * S * h * b * (R - 1) / R`` ≈ ``2 * S * h * b``;
* hybrid: ``4 * S/P * h * b * (U - 1) / U + 2 * S/P * h * b * (R - 1)``.

(xDiT's table: Ulysses ``4/N · O(p·hs)``, Ring ``2 · O(p·hs)`` per layer.) The measured bytes are counted where our
code posts each collective; the script asserts they equal the formulas and also projects the formulas to
full-size VGGT (25 frames of 518x392: 1041 tokens per frame, width 1024, bf16) per global layer.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HEADS, HEAD_DIM, TOKENS_PER_FRAME, FRAMES_PER_PROCESS = 16, 64, 261, 2


def formula_bytes(mode: str, world: int, ulysses: int, seq: int, width: int, elem: int) -> float:
    ring = world // ulysses
    shard = seq / world * width * elem
    return 4 * shard * (ulysses - 1) / ulysses + 2 * shard * (ring - 1)


def _layouts(world: int):
    return [("ulysses", world, None), ("ring", 1, None)] + ([("hybrid", 2, 2)] if world == 4 else [])


def _worker(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    from embodied_accel.ops import get_ops
    from embodied_accel.parallel import CommStats, SequenceParallelAttention, build_groups

    ops = get_ops("reference")
    shard = FRAMES_PER_PROCESS * TOKENS_PER_FRAME
    results = {}
    for mode, ulysses, degree in _layouts(world):
        groups = build_groups(mode, degree, HEADS)
        stats = CommStats()
        attend = SequenceParallelAttention(groups, ops, shard_length=shard, stats=stats)
        q, k, v = (torch.randn(1, HEADS, shard, HEAD_DIM) for _ in range(3))
        start = time.perf_counter()
        attend(q, k, v, HEAD_DIM**-0.5)
        results[mode] = {"bytes": stats.total_bytes, "all_to_all_bytes": stats.all_to_all_bytes,
                         "ring_bytes": stats.ring_bytes, "calls": stats.calls, "ulysses_degree": ulysses,
                         "seconds": time.perf_counter() - start}  # fmt: skip
    Path(f"{out}.{rank}").write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> int:
    from embodied_accel.bench.harness import result_record, write_result

    width, elem = HEADS * HEAD_DIM, 4
    layers, seconds = {}, []
    for world in (2, 4):
        tmp = Path(tempfile.mkdtemp())
        mp.spawn(_worker, args=(world, str(tmp / "init"), str(tmp / "out")), nprocs=world, join=True)
        per_rank = [json.loads((tmp / f"out.{r}").read_text()) for r in range(world)]
        seq = world * FRAMES_PER_PROCESS * TOKENS_PER_FRAME
        for mode, ulysses, _ in _layouts(world):
            measured = [r[mode]["bytes"] for r in per_rank]
            seconds.append(per_rank[0][mode]["seconds"])
            expected = formula_bytes(mode, world, ulysses, seq, width, elem)
            assert all(m == expected for m in measured), (mode, world, measured, expected)
            full = formula_bytes(mode, world, ulysses, 25 * 1041, 1024, 2)
            layers[f"{mode}_p{world}"] = {
                "processes": world, "ulysses_degree": ulysses, "ring_degree": world // ulysses,
                "sequence_tokens": seq, "measured_bytes_per_process": measured[0], "formula_bytes": expected,
                "full_size_25_frames_bf16_mb_per_global_layer": full / 2**20,
                "full_size_24_global_layers_mb": 24 * full / 2**20,
                "calls": per_rank[0][mode]["calls"],
            }  # fmt: skip
            print(f"P={world} {mode:8s} measured {measured[0] / 2**20:7.3f} MiB = formula; full-size VGGT, 25 "
                  f"frames, bf16: {full / 2**20:6.1f} MiB per global layer per process")  # fmt: skip
    record = result_record(
        model="vggt-global-attention", preset="vggt", backend="reference", capture="eager", dtype="float32",
        batch=1, views=FRAMES_PER_PROCESS, steps=1, times=seconds, aten_ops_per_call=None, peak_mem_mb=None,
        measured_call="one sequence-parallel attention layer per layout (rank 0's wall time; bytes sent per process), "
        "gloo on the CPU; the times mix layouts and process counts: the bytes are the result",
        heads=HEADS, head_dim=HEAD_DIM, tokens_per_frame=TOKENS_PER_FRAME, layouts=layers,
    )  # fmt: skip
    print(f"wrote {write_result(record, REPO / 'bench' / 'results')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
