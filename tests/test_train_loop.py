"""The fine-tuning loop on small LeRobot datasets built here: checkpoints that load_policy (and so serve) reads with
identical outputs, an exact resume, LoRA, and a policy that learns its dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pyarrow", reason="the [train] extra (pyarrow) is not installed")
pytest.importorskip("av", reason="the [train] extra (PyAV) is not installed")

from lerobot_data import CAMERAS, make_base_checkpoint, make_dataset
from safetensors.torch import load_file

from embodied_accel.data.lerobot_dataset import LeRobotDataset
from embodied_accel import load_policy
from embodied_accel.train.config import TrainSettings
from embodied_accel.train.optim import warmup_cosine_factor
from embodied_accel.train.trainer import train

#: Bookkeeping in float64 on a handful of values (statistics, fractions, schedules): a few roundings near 1e-16
#: each, so 1e-12 relative leaves room for any order of them and none for a wrong formula.
FLOAT64_ARITHMETIC = 1e-12

FIXTURE_CONFIG_KEYS = "tests/fixtures/{}_tiny/config.json"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root, episodes = make_dataset(tmp_path_factory.mktemp("data") / "ds", codec="h264")
    return root, episodes


def settings(dataset_root, checkpoint, out, **overrides) -> TrainSettings:
    values = dict(
        dataset=str(dataset_root), checkpoint=str(checkpoint), out=str(out), steps=4, batch_size=4, lr=1e-3,
        warmup_steps=1, decay_steps=4, dtype="float32", workers=0, save_every=2, log_every=1, parallel="none",
        progress=False,
    )  # fmt: skip
    values.update(overrides)
    return TrainSettings(**values)


def _observation(ds: LeRobotDataset, index: int) -> dict:
    obs = {key: ds.camera_frame(key, index) for key in CAMERAS}
    obs["observation.state"] = ds.column("observation.state")[index]
    obs["task"] = ds.task(index)
    return obs


@pytest.mark.parametrize("family", ["pi0", "pi05"])
def test_checkpoint_loads_with_identical_outputs(dataset, tmp_path, family):
    root, _ = dataset
    base = make_base_checkpoint(tmp_path / "base", family)
    run = settings(root, base, tmp_path / "run", steps=2, save_every=2)
    train(run)
    saved = tmp_path / "run" / "checkpoints" / "last" / "pretrained_model"
    loaded = load_policy(str(saved), backend="reference", progress=False)
    trained_tensors = load_file(saved.parent / "training_state" / "trainable_parameters.safetensors")
    params = dict(loaded.model.named_parameters())
    for name, value in trained_tensors.items():  # every trained tensor comes back bit for bit
        assert torch.equal(params[name], value), name
    ds = LeRobotDataset(root)
    out = loaded.infer(_observation(ds, 3), seed=0)["actions"]
    assert out.shape == (50, 7) and np.isfinite(out).all()
    config = json.loads((saved / "config.json").read_text())
    lerobot_keys = set(json.loads(open(FIXTURE_CONFIG_KEYS.format(family)).read()))
    assert set(config) == lerobot_keys, "config.json has exactly LeRobot's PI0Config / PI05Config fields"
    assert list(config["input_features"]) == [*CAMERAS, "observation.state"]
    shapes = load_file(saved / "model.safetensors")
    reference = load_file(f"tests/fixtures/{family}_tiny/model.safetensors")
    assert set(shapes) == set(reference), "model.safetensors has LeRobot's keys, lm_heads included"


def test_resume_continues_bit_identically(dataset, tmp_path):
    root, _ = dataset
    straight = settings(root, "pi0-tiny", tmp_path / "straight", steps=4)
    train(straight)
    interrupted = settings(root, "pi0-tiny", tmp_path / "resumed", steps=4, stop_after=2)
    train(interrupted)
    train(settings(root, "pi0-tiny", tmp_path / "resumed", steps=4, resume=True))
    a = load_file(tmp_path / "straight/checkpoints/000004/training_state/trainable_parameters.safetensors")
    b = load_file(tmp_path / "resumed/checkpoints/000004/training_state/trainable_parameters.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    losses = [[json.loads(x)["loss"] for x in open(d / "metrics.jsonl")] for d in (tmp_path / "straight", tmp_path / "resumed")]
    assert losses[0] == losses[1]


def test_lora_and_freezing_train_only_what_they_should(dataset, tmp_path):
    root, _ = dataset
    run = settings(root, "pi05-tiny", tmp_path / "lora", steps=2, lora_rank=4, freeze=("vision",))
    train(run)
    trained = load_file(tmp_path / "lora/checkpoints/last/training_state/trainable_parameters.safetensors")
    assert any(".down" in k for k in trained) and any(".up" in k for k in trained)
    assert not any(k.startswith("vision.") for k in trained)
    assert not any(k.endswith("qkv.weight_t") or ".original" in k for k in trained)  # the base matrices stay frozen
    saved = tmp_path / "lora/checkpoints/last/pretrained_model"
    loaded = load_policy(str(saved), backend="reference", progress=False)  # merged weights, a plain model
    assert loaded.family == "pi05"


def test_schedule_matches_lerobot_formula():
    assert warmup_cosine_factor(0, 10, 100, 0.1) == pytest.approx(1 / 11, rel=FLOAT64_ARITHMETIC)
    assert warmup_cosine_factor(10, 10, 100, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 0.1)), rel=FLOAT64_ARITHMETIC)
    assert warmup_cosine_factor(500, 10, 100, 0.1) == pytest.approx(0.1, rel=FLOAT64_ARITHMETIC)


def test_bad_settings_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="dataset: required"):
        TrainSettings(checkpoint="pi0-tiny", out=str(tmp_path)).check()
    with pytest.raises(ValueError, match="freeze: unknown part"):
        TrainSettings(dataset="d", checkpoint="pi0-tiny", out="o", freeze=("eyes",)).check()
    with pytest.raises(ValueError, match="dtype: expected one of float32, bfloat16"):
        TrainSettings(dataset="d", checkpoint="pi0-tiny", out="o", dtype="fp8").check()


def test_it_learns_the_dataset(tmp_path):
    """pi0 at the tiny width with 28-pixel images: the loss falls >= 10x, and the trained policy's sampled chunks
    (loaded from its checkpoint, as serve would) reproduce the dataset's actions far better than the initial ones.
    Camera frames are stored as PNG in the parquet rows here (cheap to decode: this test times the model)."""
    root, _ = make_dataset(tmp_path / "ds", camera_storage="image")
    base = make_base_checkpoint(tmp_path / "base", "pi0")
    steps = 250
    run = settings(root, base, tmp_path / "run", steps=steps, batch_size=8, lr=5e-3, warmup_steps=10,
                   decay_steps=steps, decay_lr=5e-4, save_every=steps, log_every=1)  # fmt: skip
    train(run)
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "run/metrics.jsonl")]
    first, last = losses[0], float(np.mean(losses[-10:]))
    assert first / last >= 10, f"loss {first:.3f} -> {last:.3f}"

    ds = LeRobotDataset(root)
    actions = ds.column("action")
    stops = np.repeat([e.stop for e in ds.episodes], [e.length for e in ds.episodes])
    errors = {}
    for name, source in (("initial", base), ("trained", tmp_path / "run/checkpoints/last/pretrained_model")):
        policy = load_policy(str(source), backend="reference", progress=False)
        squared = []
        for index in range(0, ds.num_frames, 2):
            chunk = policy.infer(_observation(ds, index), seed=index)["actions"]
            valid = min(stops[index] - index, chunk.shape[0])
            squared.append(((chunk[:valid] - actions[index : index + valid]) ** 2).mean())
        errors[name] = float(np.mean(squared))
    assert errors["trained"] < 0.2 * errors["initial"], errors


def test_command_line_and_config_file(dataset, tmp_path, capsys):
    from embodied_accel.cli import main

    root, _ = dataset
    config = tmp_path / "run.toml"
    config.write_text(f'dataset = "{root}"\ncheckpoint = "pi0-tiny"\nsteps = 2\nbatch_size = 2\nworkers = 0\n'
                      'dtype = "float32"\nwarmup_steps = 1\nlog_every = 1\n')  # fmt: skip
    out = tmp_path / "cli_run"
    code = main(["train", "--config", str(config), "--out", str(out), "--lr", "1e-4", "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "trained 2 steps x 2 samples" in printed and "checkpoint:" in printed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in ("loss", "grad_norm", "lr", "samples_per_s", "data_wait_fraction", "peak_mem_mb"):
        assert np.isfinite(records[-1][key]), key
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert json.loads((out / "checkpoints/last/pretrained_model/train_config.json").read_text())["lr"] == 1e-4

    config.write_text(config.read_text() + "learning_rate = 3\n")
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2
    assert "unknown setting(s) learning_rate" in capsys.readouterr().err
    assert main(["train", "--config", str(config).replace(".toml", ".missing.toml"), "--out", str(out)]) == 2
    assert main(["train", "--dataset", str(tmp_path / "nowhere"), "--checkpoint", "pi0-tiny", "--out", str(out)]) == 2
    assert "nowhere: not a directory" in capsys.readouterr().err


def test_allocator_setting_comes_before_the_device_and_respects_the_user():
    from embodied_accel.train.distributed import configure_allocator

    environ: dict[str, str] = {}
    assert configure_allocator("cuda", environ) and environ == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    environ = {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:128"}
    assert not configure_allocator("npu", environ) and environ["PYTORCH_NPU_ALLOC_CONF"] == "max_split_size_mb:128"
    assert not configure_allocator("cpu", environ)
