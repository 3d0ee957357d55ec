"""Sequence parallelism is exact: gloo on the CPU, 2 and 4 processes, Ulysses / Ring / hybrid equal one process.

Each worker process computes the single-process reference itself (same seeds) and its sequence-parallel result,
and reports the largest difference; the test asserts them. Attention alone runs on odd sequence lengths (padding +
masking); VGGT end to end runs the reduced preset on 3 frames (not a multiple of 2 or 4: padding frames).
"""

import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tolerances import rounding_tolerance

from embodied_accel.ops import get_ops


def _modes(world):
    return [("ulysses", None), ("ring", None)] + ([("hybrid", 2)] if world == 4 else [])


def _attention_errors(world, rank, ops):
    from embodied_accel.parallel import SequenceParallelAttention, build_groups, shard_sequence

    errors = {}
    for mode, degree in _modes(world):
        for length in (7, 13, 16):
            gen = torch.Generator().manual_seed(length)
            q, k, v = (torch.randn(2, 4, length, 8, generator=gen) for _ in range(3))
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3)
            groups = build_groups(mode, degree, num_heads=4)
            shards = [shard_sequence(t, 2, world, rank) for t in (q, k, v)]
            attn = SequenceParallelAttention(groups, ops, shard_length=shards[0].shape[2], valid_length=length)
            out = attn(*shards, 0.3)
            expected = shard_sequence(ref, 2, world, rank)
            valid = max(0, min(length - rank * shards[0].shape[2], shards[0].shape[2]))
            # relative to the largest output: a convex combination of v's rows, so no cancellation below it
            scale = expected.abs().max().item()
            err = (out[:, :, :valid] - expected[:, :, :valid]).abs().max().item() / scale if valid else 0.0
            assert torch.isfinite(out).all()
            errors[f"attention/{mode}/L{length}"] = err
            errors[f"bytes/{mode}/L{length}"] = attn.stats.total_bytes
    return errors


def _vggt_errors(world, rank, ops):
    from embodied_accel.models.vggt.loading import load_vggt_model
    from embodied_accel.parallel import shard_frames
    from embodied_accel.pipelines.reconstruction import VggtRunner

    model, _ = load_vggt_model("vggt-tiny", backend="reference", device="cpu", seed=3, progress=False)
    gen = torch.Generator().manual_seed(7)
    images = torch.rand(1, 3, 3, 42, 56, generator=gen)
    query = torch.tensor([[[10.0, 12.0], [40.0, 30.0], [3.0, 38.0]]])
    single = VggtRunner(model, torch.device("cpu"))(images, query)
    cfg = model.config
    tokens = cfg.patch_start + (42 // 14) * (56 // 14)
    errors = {}
    for mode, degree in _modes(world):
        shards, local = shard_frames(images, tokens, mode, ops, degree, cfg.num_heads)
        runner = VggtRunner(model, torch.device("cpu"), shards)
        out = runner(local, query, first_frame=shards.first_frame)
        # streamed on the shard (the layers of this process's frames only): the same outputs, bit for bit
        streamed = runner.stream(local, frames_chunk_size=8, query_points=query, first_frame=shards.first_frame)
        same = all(torch.equal(v, getattr(streamed, k)) for k, v in out.as_dict().items())
        errors[f"vggt_stream/{mode}"] = 0.0 if same and streamed.as_dict().keys() == out.as_dict().keys() else 1.0
        frames = slice(shards.first_frame, min(shards.first_frame + shards.local_frames, 3))
        n = frames.stop - frames.start
        pairs = [(getattr(out, k), getattr(single, k)) for k in ("pose_enc", "track", "vis", "conf")]
        if n > 0:
            pairs += [(getattr(out, k)[:, :n], getattr(single, k)[:, frames])
                      for k in ("depth", "depth_conf", "world_points", "world_points_conf")]  # fmt: skip
        # |ours - single| / (1 + |single|): absolute below 1, relative above (tracks are pixels, points up to ~1e2)
        errors[f"vggt/{mode}"] = max(((a - b).abs() / (1 + b.abs())).max().item() for a, b in pairs)
    return errors


def _worker(rank, world, init_file, result_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ops = get_ops("reference")
        errors = {**_attention_errors(world, rank, ops), **_vggt_errors(world, rank, ops)}
        try:  # an Ulysses degree that does not divide the heads is refused before any collective runs
            from embodied_accel.parallel import build_groups

            build_groups("ulysses", num_heads=5)
            errors["refuses_indivisible_heads"] = 1.0
        except ValueError as exc:
            errors["refuses_indivisible_heads"] = 0.0 if "does not divide the 5 attention heads" in str(exc) else 1.0
        with open(f"{result_file}.{rank}", "w") as f:
            json.dump(errors, f)
    finally:
        dist.destroy_process_group()


#: The parallel runs sum the same terms in another order (attention over shards merged by their softmax statistics):
#: attention alone, 16 keys of width 8 and the softmax's few roundings; VGGT end to end, sums of up to 288 terms (the
#: DPT's 3x3 convolutions over 32 channels) about 80 dependent layers deep (12 transformer blocks of 4 GEMMs, the
#: camera trunk's 4 iterations, the DPT's ~20 layers, the track head), and exp / expm1 on the dense heads, which turn
#: their argument's absolute error (|x| <= log1p(1e2) + 1 for points up to 1e2) into a relative one.
TOLERANCES = {
    "attention": rounding_tolerance(terms=16, chain=4),
    "vggt": rounding_tolerance(terms=288, chain=80) * 5.7,
    "refuses_indivisible_heads": 0.0,
    "vggt_stream": 0.0,
}


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_equals_one_process(tmp_path, world):
    result = tmp_path / "errors"
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(result)), nprocs=world, join=True)
    per_rank = [json.loads((tmp_path / f"errors.{r}").read_text()) for r in range(world)]
    for rank, errors in enumerate(per_rank):
        for key, value in errors.items():
            if key.startswith("bytes/"):
                continue
            bound = TOLERANCES[key.split("/")[0]]
            assert math.isfinite(value) and value <= bound, f"rank {rank} {key}: max error {value:.3g} > {bound:.3g}"
    # Communication per rank: Ulysses sends 4 tensors x (P-1)/P of its shard; Ring sends K and V (P-1) times.
    shard = -(-16 // world)
    elems = 2 * 4 * shard * 8 * 4  # batch x heads x shard x head_dim x fp32 bytes
    assert per_rank[0]["bytes/ulysses/L16"] == 4 * elems * (world - 1) // world
    assert per_rank[0]["bytes/ring/L16"] == 2 * elems * (world - 1)
