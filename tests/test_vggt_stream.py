"""VGGT streamed (:meth:`VggtRunner.stream`): the same outputs as the whole call bit for bit (same ops, same order),
in eager and in the CUDA-graph mode's CPU stand-in, for any frame chunk and batch; the memory budget picks the
chunk; the aggregator keeps only what the heads read; ``reconstruct --plan`` prints the estimate without running;
``reconstruct`` writes per-frame arrays, COLMAP text files and the point cloud of the whole-call path."""

import json
import math

import numpy as np
import pytest
import torch
from test_cudagraph import ReplayStandIn
from test_vggt_capture import GPU

from embodied_accel import cli
from embodied_accel.models.vggt import export
from embodied_accel.models.vggt.config import PRESETS
from embodied_accel.models.vggt.geometry import quaternion_to_matrix
from embodied_accel.models.vggt.memory import (
    GB,
    chunk_for_budget,
    estimate_memory,
    fit_chunk,
    meta_weight_bytes,
    weight_bytes,
)
from embodied_accel.models.vggt.chunking import MIN_CHUNK_ROWS, row_chunks
from embodied_accel.pipelines.reconstruction import load_vggt_pipeline

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runner():
    return load_vggt_pipeline("vggt-tiny", progress=False, device="cpu")


def assert_same(streamed, whole):
    streamed, whole = streamed.as_dict(), whole.as_dict()
    assert set(streamed) == set(whole)
    for name, value in whole.items():
        assert torch.equal(streamed[name], value), name
    for a, b in zip(streamed.get("pose_enc_list", []), whole.get("pose_enc_list", []), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("batch, frames, chunk", [(1, 5, 2), (1, 3, 8), (2, 3, 4)])
def test_streamed_outputs_equal_the_whole_call_bit_for_bit(runner, batch, frames, chunk):
    g = torch.Generator().manual_seed(batch * 10 + frames)
    images = torch.rand(batch, frames, 3, 28, 42, generator=g)
    query_points = torch.rand(batch, 3, 2, generator=g) * 20
    whole = runner(images, query_points, frames_chunk_size=chunk)
    seen = []
    streamed = runner.stream(images, frames_chunk_size=chunk, query_points=query_points,
                             on_cameras=lambda poses: seen.append(len(poses)))  # fmt: skip
    assert_same(streamed, whole)
    assert seen == [runner.config.camera.iterations]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_aggregator_in_place_by_frame_chunks_equals_whole_blocks_bit_for_bit(runner, monkeypatch, threads):
    """Each round's blocks over chunks of frames, written in place, give the values of the blocks over every frame
    at once (new tensors per block, kept layers concatenated): at 1 and 2 threads. The CPU BLAS's GEMM depends on
    the row count below MIN_CHUNK_ROWS (the chunks never go below it), and the fused attention with 2 threads on
    8-value heads (vggt-tiny's) on the number of frames (it always runs over all of them)."""
    model = runner.model
    # 11 tokens a frame (and 11 DINOv2 tokens): a frame per chunk would be an 11-row GEMM, whose bits differ from
    # the tall GEMM's with 2 threads; the chunks keep at least MIN_CHUNK_ROWS rows
    images = torch.rand(2, 7, 3, 28, 42, generator=torch.Generator().manual_seed(7))
    buffers = runner.buffers(runner.bucket_of(images))
    assert [(c.start, c.stop) for c in row_chunks(2 * 7 * 11, 11, 1)] == [(0, 66), (66, 154)]
    assert [(c.start, c.stop) for c in row_chunks(7 * 11, 11, 1)] == [(0, 77)]  # a remainder under the floor
    assert all(c.stop - c.start >= MIN_CHUNK_ROWS for c in row_chunks(1000, 21, 1))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            whole = model.aggregator.forward_whole(images, buffers)
            for chunk in (1, 3, 5, None):
                monkeypatch.setattr(model.aggregator, "chunk_frames", chunk)
                chunked = model.aggregator(images, buffers)
                assert sorted(chunked) == sorted(whole)
                for i, value in whole.items():
                    assert torch.equal(chunked[i], value), (chunk, i)
    finally:
        torch.set_num_threads(previous)


def test_chunks_arrive_in_order_as_each_finishes(runner):
    images = torch.rand(1, 5, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    whole = runner(images, frames_chunk_size=2)
    chunks = []
    runner.stream(images, lambda start, out: chunks.append((start, {k: v.clone() for k, v in out.items()})),
                  frames_chunk_size=2)  # fmt: skip
    assert [start for start, _ in chunks] == [0, 2, 4]
    assert [out["depth"].shape[0] for _, out in chunks] == [2, 2, 1]
    for name in ("depth", "depth_conf", "world_points", "world_points_conf"):
        assert torch.equal(torch.cat([out[name] for _, out in chunks])[None], getattr(whole, name))


def test_graph_mode_streams_through_captured_calls(runner):
    standin = ReplayStandIn()
    graphed = runner.with_capture("cudagraph", plat=GPU, graph_backend=standin)
    images = torch.rand(1, 5, 3, 28, 28, generator=torch.Generator().manual_seed(2))
    whole = runner(images, frames_chunk_size=2)
    for _ in range(2):
        assert_same(graphed.stream(images, frames_chunk_size=2), whole)
    # aggregator, camera head, dense chunks of 2 frames and the last of 1: four graphs, captured once
    assert standin.captures == 4


def test_aggregator_keeps_only_the_layers_the_heads_read(runner):
    model = runner.model
    buffers = runner.buffers(runner.bucket_of(torch.zeros(1, 2, 3, 28, 28)))
    layers = model.aggregate(torch.rand(1, 2, 3, 28, 28), buffers)
    assert sorted(layers) == list(model.config.kept_layers) == [1, 2, 3, 4]
    assert all(v.shape[2] == buffers.tokens_per_frame for v in layers.values())
    camera_only = PRESETS["vggt-tiny"].__class__(**{**PRESETS["vggt-tiny"].__dict__, "dpt_layers": (0, 1, 2, 3)})
    assert camera_only.kept_layers == (0, 1, 2, 3, 4) and camera_only.dense_layers == (0, 1, 2, 3)
    depth_off = PRESETS["vggt-tiny"].__class__(**{**PRESETS["vggt-tiny"].__dict__, "enable_depth": False,
                                                   "enable_point": False, "enable_track": False})  # fmt: skip
    assert depth_off.kept_layers == (4,) and depth_off.dense_layers == ()


def test_the_budget_picks_the_chunk_and_an_impossible_budget_names_it(runner):
    model = runner.model
    common = dict(dtype_bytes=4, weights=weight_bytes(model))
    one = estimate_memory(model.config, 4, (28, 28), 1, **common)
    per_frame = estimate_memory(model.config, 4, (28, 28), 2, **common).dense_chunk - one.dense_chunk
    budget = (one.heads_peak + 2.5 * per_frame) / GB  # room for 3 frames per pass, not 4
    assert chunk_for_budget(model, 4, (28, 28), budget) == 3
    assert chunk_for_budget(model, 4, (28, 28), 10.0) == 4
    images = torch.rand(1, 4, 3, 28, 28, generator=torch.Generator().manual_seed(3))
    assert_same(runner.stream(images, max_memory=budget), runner(images, frames_chunk_size=3))
    with pytest.raises(ValueError, match=r"max_memory 1e-06 GB: 64 frames of 28x28 need at least [\d.]+ MB"):
        chunk_for_budget(model, 64, (28, 28), 1e-6)


def test_the_full_model_plan_at_a_thousand_frames():
    config = PRESETS["vggt"]
    common = dict(dtype_bytes=2, weights=meta_weight_bytes(config, torch.bfloat16))
    one = estimate_memory(config, 1000, (518, 518), 1, **common)
    # 1,374 tokens x 2,048 values x 4 layers x 2 bytes per frame: the layers the DPT heads read
    assert one.layers == 1000 * 1374 * 2048 * 4 * 2
    assert 2.5 * GB < one.weights < 3.5 * GB
    chunk = fit_chunk(config, 1000, (518, 518), 80.0, **common)
    assert estimate_memory(config, 1000, (518, 518), chunk, **common).peak <= 80 * GB
    assert estimate_memory(config, 1000, (518, 518), chunk + 1, **common).peak > 80 * GB
    with pytest.raises(ValueError, match="2000 frames of 518x518 need at least"):
        fit_chunk(config, 2000, (518, 518), 80.0, **common)


def test_reconstruct_plan_prints_without_running(capsys):
    code = cli.main(["reconstruct", "--plan", "--model", "vggt", "--dtype", "bfloat16", "--max-memory", "80"])
    out = capsys.readouterr().out
    assert code == 0
    assert "vggt (bfloat16), 518x518 frames (1374 tokens, 2048-wide layers, 4 dense" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert set(rows) == {"1000", "2000"} and rows["1000"][-1] == "yes"
    assert "random weights" not in out  # nothing was built


def test_reconstruct_streams_per_frame_files_and_the_whole_call_point_cloud(tmp_path, capsys, runner):
    target = tmp_path / "scene.ply"
    code = cli.main(["reconstruct", "-o", str(target), "--no-progress", "--frames-chunk-size", "3", "--colmap",
                     "--max-points", "999"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    cameras = json.loads((tmp_path / "scene_cameras.json").read_text())
    names = [c["image"].rsplit(".", 1)[0] for c in cameras["cameras"]]
    depth_dir = tmp_path / "scene_depth"
    for name in names:
        for kind in ("depth", "conf", "points", "points_conf"):
            assert (depth_dir / f"{name}_{kind}.npy").is_file()
    # the point cloud of the per-frame files equals filter_points + write_ply over all frames at once
    points = np.stack([np.load(depth_dir / f"{n}_points.npy") for n in names])
    conf = np.stack([np.load(depth_dir / f"{n}_points_conf.npy") for n in names])
    colors = np.random.default_rng(0).integers(0, 256, points.shape, dtype=np.uint8)
    kept, kept_colors = export.filter_points(points, colors, conf, 50.0, 999)
    export.write_ply(tmp_path / "whole.ply", kept, kept_colors)
    count = export.write_ply_frames(tmp_path / "frames.ply", len(names), lambda i: (points[i], colors[i], conf[i]),
                                    50.0, 999)  # fmt: skip
    assert count == len(kept) and (tmp_path / "frames.ply").read_bytes() == (tmp_path / "whole.ply").read_bytes()
    # COLMAP: one PINHOLE camera per image, the camera-from-world rotation as a unit quaternion
    colmap = tmp_path / "scene_colmap"
    lines = [line for line in (colmap / "images.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert len(lines) == len(names) and (colmap / "points3D.txt").is_file()
    qw, qx, qy, qz = map(float, lines[0].split()[1:5])
    rotation = quaternion_to_matrix(torch.tensor([qx, qy, qz, qw], dtype=torch.float64)).numpy()
    assert np.allclose(rotation, np.array(cameras["cameras"][0]["extrinsics"])[:, :3], atol=1e-6)
    assert math.isclose(qw * qw + qx * qx + qy * qy + qz * qz, 1.0, rel_tol=1e-9)
    assert len((colmap / "cameras.txt").read_text().splitlines()) == 3 + len(names)


def test_reconstruct_names_a_budget_too_small_by_its_flag(tmp_path, capsys):
    code = cli.main(["reconstruct", "-o", str(tmp_path / "s.ply"), "--no-progress", "--max-memory", "0.000001"])
    err = capsys.readouterr().err
    assert code == 2 and "--max-memory 1e-06 GB: 4 frames of" in err and "need at least" in err
