"""Data parallelism is exact: DDP over 2 gloo processes equals one process on the combined batch, FSDP2 equals DDP
(after a few AdamW steps, fp32, tiny config, padded action chunks so the global loss normalization matters), and an
FSDP2 run stopped and resumed continues bit for bit."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("pyarrow", reason="the [train] extra (pyarrow) is not installed")
pytest.importorskip("av", reason="the [train] extra (PyAV) is not installed")

from lerobot_data import make_dataset
from safetensors.torch import load_file

from embodied_accel.train.config import TrainSettings
from embodied_accel.train.trainer import train

TOLERANCE = 1e-6
STEPS = 3

pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="torch built without gloo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, runs: list[tuple[int, TrainSettings]]) -> None:
    """One rank: the runs one after the other, each in its own process group (its own port)."""
    torch.set_num_threads(1)
    for port, settings in runs:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world_size))  # fmt: skip
        train(settings)


def _settings(root, out, batch_size, parallel, **more) -> TrainSettings:
    return TrainSettings(
        dataset=str(root), checkpoint="pi05-tiny", out=str(out), steps=STEPS, batch_size=batch_size, lr=1e-4,
        warmup_steps=1, decay_steps=STEPS, dtype="float32", workers=0, save_every=1, log_every=1,
        parallel=parallel, progress=False, device="cpu", **more,
    )  # fmt: skip


def _trained(out) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints/last/training_state/trainable_parameters.safetensors")


def _max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    root, _ = make_dataset(tmp / "ds", codec="h264")
    train(_settings(root, tmp / "single", 4, "none"))
    runs = [(_free_port(), _settings(root, tmp / mode, 2, mode)) for mode in ("ddp", "fsdp")]
    runs.append((_free_port(), _settings(root, tmp / "fsdp_resumed", 2, "fsdp", stop_after=1)))
    runs.append((_free_port(), _settings(root, tmp / "fsdp_resumed", 2, "fsdp", resume=True)))
    mp.spawn(_rank_main, args=(2, runs), nprocs=2, join=True)
    return {name: _trained(tmp / name) for name in ("single", "ddp", "fsdp", "fsdp_resumed")}


def test_ddp_equals_one_process_on_the_combined_batch(runs):
    assert _max_difference(runs["ddp"], runs["single"]) <= TOLERANCE


def test_fsdp2_equals_ddp(runs):
    assert _max_difference(runs["fsdp"], runs["ddp"]) <= TOLERANCE


def test_fsdp2_resume_is_bit_identical(runs):
    """Stopped after step 1 (full state gathered to rank 0 and saved), resumed on 2 ranks (trainable tensors loaded
    before sharding, the optimizer state sharded from the full one): the same tensors as the uninterrupted run."""
    assert runs["fsdp_resumed"].keys() == runs["fsdp"].keys()
    assert all(torch.equal(runs["fsdp_resumed"][k], runs["fsdp"][k]) for k in runs["fsdp"])
