"""``embodied-accel reconstruct``: a real run on the bundled sample, its output files, and bad input (empty or
mixed folders, unreadable images, a non-VGGT or mismatched checkpoint, --sp outside torchrun) as clear errors."""

import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tolerances import assert_rounding_close, rounding_tolerance

from embodied_accel import cli
from embodied_accel.models.vggt.export import read_ply
from embodied_accel.models.vggt.geometry import (
    depth_to_world_points,
    pose_auc,
    pose_encoding_to_cameras,
    quaternion_to_matrix,
    relative_pose_errors,
)
from embodied_accel.models.vggt.loading import load_vggt_model
from embodied_accel.models.vggt.weights import CheckpointError
from embodied_accel.pipelines.reconstruction import SAMPLE_DIR

FIXTURE = Path(__file__).parent / "fixtures" / "vggt_tiny"


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_reconstruct_the_bundled_sample(tmp_path, capsys):
    target = tmp_path / "out" / "scene.ply"
    code, out, err = run_cli(capsys, "reconstruct", "-o", target, "--glb", "--no-progress")
    assert code == 0, err
    assert "random weights" in out and "stages: aggregator" in out and "heads" in out
    frames = sorted(p.stem for p in SAMPLE_DIR.glob("*.png"))
    cameras = json.loads((tmp_path / "out" / "scene_cameras.json").read_text())
    assert [c["image"] for c in cameras["cameras"]] == [f"{f}.png" for f in frames]
    assert np.array(cameras["cameras"][0]["extrinsics"]).shape == (3, 4)
    assert np.array(cameras["cameras"][0]["intrinsics"]).shape == (3, 3)
    depth_dir = tmp_path / "out" / "scene_depth"
    for frame in frames:
        for suffix in ("_depth.png", "_conf.png", "_depth.npy", "_conf.npy"):
            assert (depth_dir / f"{frame}{suffix}").is_file()
    depth = np.load(depth_dir / f"{frames[0]}_depth.npy")
    assert depth.shape == tuple(cameras["image_size_hw"]) and np.isfinite(depth).all()
    points, colors = read_ply(target)
    total = len(frames) * depth.size
    assert 0 < len(points) <= total and colors.dtype == np.uint8 and np.isfinite(points).all()
    glb = (tmp_path / "out" / "scene.glb").read_bytes()
    magic, version, length = struct.unpack("<III", glb[:12])
    assert magic == 0x46546C67 and version == 2 and length == len(glb)


def test_reconstruct_with_a_checkpoint_in_the_released_layout(tmp_path, capsys):
    target = tmp_path / "scene.ply"
    code, out, err = run_cli(capsys, "reconstruct", SAMPLE_DIR, "-o", target, "--checkpoint", FIXTURE,
                             "--preset", "vggt-tiny", "--points-from", "pointmap", "--no-progress")  # fmt: skip
    assert code == 0, err
    assert "random weights" not in out and target.is_file()


@pytest.mark.parametrize(
    "setup, fragment",
    [
        ("empty", "no images"),
        ("mixed", "mixes 1 image(s) with 1 other entry (notes.txt)"),
        ("unreadable", "not a readable image"),
        ("missing", "not a directory"),
    ],
)
def test_bad_image_folders_are_clear_errors(tmp_path, capsys, setup, fragment):
    folder = tmp_path / "images"
    if setup != "missing":
        folder.mkdir()
    if setup in ("mixed", "unreadable"):
        shutil.copy(next(SAMPLE_DIR.glob("*.png")), folder / "a.png")
    if setup == "mixed":
        (folder / "notes.txt").write_text("not a frame")
    if setup == "unreadable":
        (folder / "b.png").write_bytes(b"\x89PNG but not really")
    code, _, err = run_cli(capsys, "reconstruct", folder, "-o", tmp_path / "s.ply", "--no-progress")
    assert code == 2 and fragment in err, err
    if setup == "unreadable":
        assert "b.png" in err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--sp", "ring"], "torchrun"),
        (["-o", "scene.obj"], "expected a .ply"),
        (["--preset", "vggt-tiny"], "--preset describes a --checkpoint"),
        (["--ulysses-degree", "2"], "--sp hybrid"),
        (["--frames-chunk-size", "0"], "integer >= 1"),
        (["--conf-percentile", "120"], "percentile in [0, 100]"),
    ],
)
def test_bad_flags_are_clear_errors(tmp_path, capsys, argv, fragment, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    if "-o" not in argv:
        argv = [*argv, "-o", str(tmp_path / "s.ply")]
    code, _, err = run_cli(capsys, "reconstruct", *argv, "--no-progress")
    assert code == 2 and fragment in err, err


def test_non_vggt_checkpoint_is_refused(tmp_path, capsys):
    save_file({"model.paligemma_with_expert.x.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors")
    code, _, err = run_cli(capsys, "reconstruct", SAMPLE_DIR, "--checkpoint", tmp_path, "-o", tmp_path / "s.ply")
    assert code == 2 and "not a VGGT checkpoint" in err


def test_mismatched_checkpoint_lists_every_problem(tmp_path):
    state = load_file(FIXTURE / "model.safetensors")
    del state["aggregator.frame_blocks.0.attn.q_norm.weight"]
    state["aggregator.extra.weight"] = torch.zeros(1)
    state["depth_head.norm.weight"] = torch.zeros(3)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as info:
        load_vggt_model(tmp_path, preset="vggt-tiny", device="cpu", backend="reference", progress=False)
    message = str(info.value)
    assert "1 missing tensor(s):\n  aggregator.frame_blocks.0.attn.q_norm.weight" in message
    assert "1 unexpected tensor(s):\n  aggregator.extra.weight" in message
    assert "depth_head.norm.weight: checkpoint [3], expected [64]" in message


def test_a_weight_stored_as_integers_is_refused_by_name(tmp_path):
    state = load_file(FIXTURE / "model.safetensors")
    state["camera_head.embed_pose.weight"] = state["camera_head.embed_pose.weight"].to(torch.int32)
    save_file(state, tmp_path / "model.safetensors")
    torch.save(state, tmp_path / "model.pt")
    for path in (tmp_path, tmp_path / "model.pt"):
        with pytest.raises(CheckpointError, match="camera_head.embed_pose.weight: checkpoint I32, expected a floating"):
            load_vggt_model(path, device="cpu", backend="reference", progress=False)


def test_pt_file_and_module_prefix_load_like_safetensors(tmp_path):
    state = {f"module.{k}": v for k, v in load_file(FIXTURE / "model.safetensors").items()}
    torch.save({"model": state}, tmp_path / "model.pt")
    a, _ = load_vggt_model(tmp_path / "model.pt", preset="vggt-tiny", device="cpu", backend="reference", progress=False)
    b, _ = load_vggt_model(FIXTURE, preset="vggt-tiny", device="cpu", backend="reference", progress=False)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert not any(p.requires_grad for p in a.parameters())


def test_hub_config_must_agree_with_the_preset(tmp_path):
    shutil.copy(FIXTURE / "model.safetensors", tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"img_size": 518, "patch_size": 14, "embed_dim": 32}))
    with pytest.raises(CheckpointError, match="img_size=518"):
        load_vggt_model(tmp_path, preset="vggt-tiny", device="cpu", backend="reference", progress=False)


def test_cameras_from_pose_encoding_and_unprojection():
    angle = torch.tensor(0.3)
    quat = torch.stack([torch.zeros(()), torch.sin(angle / 2), torch.zeros(()), torch.cos(angle / 2)])  # about y
    enc = torch.cat([torch.tensor([0.1, -0.2, 0.5]), quat, torch.tensor([1.0, 1.2])])[None]
    ext, intr = pose_encoding_to_cameras(enc, (40, 60))
    rotation = quaternion_to_matrix(quat)
    # quaternion -> matrix and R R^T: products and 3-term sums of unit-size values in float32
    torch.testing.assert_close(rotation @ rotation.T, torch.eye(3), atol=rounding_tolerance(terms=3, chain=3), rtol=0)
    assert intr[0, 0, 2] == 30 and intr[0, 1, 2] == 20
    # the same formula in float32: a tan and a quotient, each within a rounding or two
    torch.testing.assert_close(intr[0, 1, 1], 20 / torch.tan(torch.tensor(0.5)), rtol=rounding_tolerance(chain=3), atol=0)
    depth = torch.rand(1, 40, 60) + 1
    world = depth_to_world_points(depth, ext, intr)
    cam = world[0] @ ext[0, :, :3].T + ext[0, :, 3]  # back to the camera frame
    # unprojected (depth K^-1 p, a rotation and a translation) and projected back: 3-term sums, about 8 roundings
    # deep, relative to the points' coordinates
    assert_rounding_close(cam[..., 2], depth[0], terms=3, chain=8, scale=world.abs().max())
    rot_err, trans_err = relative_pose_errors(torch.cat([ext, ext]), torch.cat([ext, ext]))
    # the same poses: only float64's rounding of R^T R's asymmetric part reaches atan2 (well conditioned at 0)
    bound = math.degrees(rounding_tolerance(torch.float64, terms=3, chain=3))
    assert rot_err.abs().max() <= bound and pose_auc(rot_err, trans_err.nan_to_num(0)) == 1.0


def meta_checkpoint(layout):
    """A checkpoint of the released full-size layout whose tensors are shapes only (meta device: no memory)."""
    from embodied_accel.models.loading import reader_of_state_dict

    return reader_of_state_dict("VGGT-1B/model.pt", {k: torch.empty(s, device="meta") for k, s in layout.items()})


def test_full_size_loader_reads_exactly_the_released_layout():
    """Every tensor of upstream's full-size VGGT() (recorded by the fixture generator) is read with the shape we
    expect, except DINOv2's training-only mask token; the whole strict load runs on the meta device."""
    import gzip

    from embodied_accel.models.vggt.config import get_preset
    from embodied_accel.models.vggt.model import VggtModel
    from embodied_accel.models.vggt.weights import (
        IGNORED_KEYS,
        config_for_checkpoint,
        load_checkpoint_weights,
        paired_block_diagonal,
    )
    from embodied_accel.ops import get_ops

    with gzip.open(FIXTURE / "vggt1b_layout.json.gz", "rt", encoding="utf-8") as f:
        layout = json.load(f)
    source = meta_checkpoint(layout)
    config = config_for_checkpoint(source, {"img_size": 518, "patch_size": 14, "embed_dim": 1024}, None)
    assert config == get_preset("vggt")
    with torch.device("meta"):
        model = VggtModel(config, get_ops("reference"))
    load_checkpoint_weights(model, source, "meta", progress=False)
    # the paired depth / point heads' last 1×1 GEMM holds both heads' matrices as blocks of one (zeros between)
    padding = sum(
        model.get_parameter(name).numel() - sum(out * inp for out, inp in blocks)
        for name, blocks in paired_block_diagonal(model).items()
        if name.endswith("weight_t")
    )
    assert padding == 64 * 6 - 32 * (2 + 4)
    assert (
        sum(p.numel() for p in model.parameters()) - padding
        == sum(torch.Size(s).numel() for k, s in layout.items() if k not in IGNORED_KEYS)
        == 1_256_536_492
    )
    assert model.aggregator.frame_blocks[23].attn.qkv.weight_t.shape == (1024, 3072)


def _reconstruct_worker(rank, world, port, argv, result_dir):
    """One torchrun-like process of ``reconstruct --sp`` (gloo on the CPU)."""
    import os

    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    try:
        code = cli.main(argv)
        Path(result_dir, f"code.{rank}").write_text(str(code))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_reconstruct_sp_streams_each_chunk_to_rank_zero(tmp_path, capsys):
    """``--sp`` over 2 processes (3 frames: 2 per process, the last one padding), one frame per chunk: rank 0
    writes every frame's files from the gathered chunks, and they match one process's run within the
    sequence-parallel tolerance (attention merged across shards); the padding frame writes nothing."""
    import socket

    import torch.multiprocessing as mp
    from test_parallel import TOLERANCES

    folder = tmp_path / "frames"
    folder.mkdir()
    for path in sorted(SAMPLE_DIR.glob("*.png"))[:3]:
        shutil.copy(path, folder / path.name)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    common = ["reconstruct", str(folder), "--no-progress", "--frames-chunk-size", "1", "--colmap"]
    single = tmp_path / "one" / "scene.ply"
    code, _, err = run_cli(capsys, *common, "-o", single)
    assert code == 0, err
    parallel = tmp_path / "sp" / "scene.ply"
    argv = [*common, "-o", str(parallel), "--sp", "ring"]
    mp.spawn(_reconstruct_worker, args=(2, port, argv, str(tmp_path)), nprocs=2, join=True)
    assert [(tmp_path / f"code.{r}").read_text() for r in range(2)] == ["0", "0"]
    frames = sorted(p.stem for p in folder.glob("*.png"))
    files = sorted(p.name for p in (tmp_path / "sp" / "scene_depth").glob("*.npy"))
    assert files == sorted(f"{f}_{k}.npy" for f in frames for k in ("depth", "conf", "points", "points_conf"))
    for name in files:
        a, b = (np.load(d / "scene_depth" / name) for d in (tmp_path / "sp", tmp_path / "one"))
        error = float(np.max(np.abs(a - b) / (1 + np.abs(b))))
        assert error <= TOLERANCES["vggt"], (name, error)
    assert parallel.is_file() and (tmp_path / "sp" / "scene_colmap" / "images.txt").is_file()
    cameras = json.loads((tmp_path / "sp" / "scene_cameras.json").read_text())
    assert [c["image"] for c in cameras["cameras"]] == [f"{f}.png" for f in frames]
