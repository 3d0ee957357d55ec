"""VGGT in every capture mode through the one runner: ``reconstruct --capture compile`` writes what eager writes;
the CUDA-graph modes capture the aggregator and the heads once per bucket (on the CPU through the replay stand-in,
which also rejects capture-unsafe ops), equal to eager."""

import json
import shutil

import numpy as np
import pytest
import torch
from test_cudagraph import ReplayStandIn
from tolerances import assert_rounding_close

from embodied_accel import cli
from embodied_accel.pipelines.reconstruction import SAMPLE_DIR, load_vggt_pipeline
from embodied_accel.platform import Platform

GPU = Platform("cuda", "CPU stand-in for a GPU", has_triton=True, has_torch_npu=False)
#: vggt-tiny: its longest sums are the MLPs' (4 x 32 = 128 terms) and global attention over 2 frames of 2x2 patches
#: plus 5 special tokens each; a value passes the 2 patch-embedding blocks, the 5 rounds of frame and global blocks
#: and the deepest head (the DPT's 4 fusion stages and its convolutions, 9 x 8 = 72 terms each): 20 dependent steps.
VGGT_TINY_TERMS, VGGT_TINY_CHAIN = 128, 20


def reconstruct(tmp_path, name, *extra):
    frames = tmp_path / "frames"
    if not frames.is_dir():
        frames.mkdir()
        for path in sorted(SAMPLE_DIR.glob("*.png"))[:2]:
            shutil.copy(path, frames / path.name)
    target = tmp_path / name / "scene.ply"
    code = cli.main(["reconstruct", str(frames), "-o", str(target), "--image-size", "28", "--no-progress", *extra])
    assert code == 0
    cameras = json.loads((tmp_path / name / "scene_cameras.json").read_text())
    depth = np.stack([np.load(p) for p in sorted((tmp_path / name / "scene_depth").glob("*_depth.npy"))])
    return cameras, depth


@pytest.mark.compile
def test_reconstruct_capture_compile_writes_what_eager_writes(tmp_path, capsys):
    cameras, depth = reconstruct(tmp_path, "eager")
    compiled_cameras, compiled_depth = reconstruct(tmp_path, "compiled", "--capture", "compile")
    assert "capture compile" in capsys.readouterr().out
    tolerance = dict(terms=VGGT_TINY_TERMS, chain=VGGT_TINY_CHAIN)
    assert_rounding_close(compiled_depth, depth, **tolerance)
    for ours, reference in zip(compiled_cameras["cameras"], cameras["cameras"], strict=True):
        for key in ("extrinsics", "intrinsics"):
            assert_rounding_close(np.array(ours[key]), np.array(reference[key]), **tolerance)


@pytest.mark.parametrize("mode", ["cudagraph"])
def test_graph_modes_capture_each_stage_once_per_bucket(mode):
    eager = load_vggt_pipeline("vggt-tiny", progress=False, device="cpu")
    standin = ReplayStandIn()
    graphed = eager.with_capture(mode, plat=GPU, graph_backend=standin)
    assert graphed.model is eager.model and graphed.static_buffers is not eager.static_buffers
    images = torch.rand(1, 2, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    reference = eager(images).as_dict()
    for _ in range(2):
        out = graphed(images).as_dict()
        assert set(out) == set(reference)
        for key, value in reference.items():
            assert_rounding_close(out[key], value, terms=VGGT_TINY_TERMS, chain=VGGT_TINY_CHAIN)
    assert standin.captures == 2 and graphed.runner.graph_cache.live == 2  # aggregator and heads, one bucket
    graphed(torch.rand(1, 3, 3, 28, 28))  # another frame count: another bucket, its own buffers and graphs
    assert standin.captures == 4 and graphed.static_buffers.builds["vggt"] == 2
    assert graphed.runner.capture_seconds >= 0


@pytest.mark.compile
def test_sequence_parallel_runs_are_eager_only(tmp_path, capsys):
    code = cli.main(["reconstruct", "-o", str(tmp_path / "s.ply"), "--sp", "ulysses", "--capture", "compile"])
    assert code == 2 and "--sp) is eager only" in capsys.readouterr().err
