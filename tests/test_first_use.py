"""What a new user meets first: the README's install line, every command's --log-level, the help text, messages
that name the extra or the preset to use, run's warm latency, profile's chart / verdict / op count, train with no
dataset, eval's progress and default plan, reconstruct's order of work, load_policy's silence."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from embodied_accel import cli

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------------------------
# Install line, help, options
# ---------------------------------------------------------------------------------------------------------------


def test_the_readme_says_how_to_get_the_cpu_build_and_keeps_its_two_commands():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert block[0].startswith("pip install torch==2.13.0 && pip install -e . && embodied-accel run")
    assert block[1].startswith("pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest")
    intro = text[: text.index("## What it is")]
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in intro
    assert "first gives the CPU build" not in intro


@pytest.mark.parametrize(
    "argv",
    [
        ["shape", "--log-level", "info"],
        ["reconstruct", "--log-level", "info"],
        ["eval", "libero", "--suite", "spatial", "--log-level", "info"],
        ["train", "--log-level", "info"],
    ],
)
def test_every_command_takes_log_level_after_its_name(argv):
    assert cli.build_parser().parse_args(argv).log_level == "INFO"


def test_the_top_level_help_lists_what_the_commands_do(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    assert "fine-tune" in out and "VGGT" in out and "Hunyuan3D-2" in out
    for command in ("run", "profile", "train", "eval libero", "reconstruct", "shape"):
        assert f"embodied-accel {command}" in out, command


# ---------------------------------------------------------------------------------------------------------------
# Messages that name what to do
# ---------------------------------------------------------------------------------------------------------------


def test_groot_without_its_extra_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # as if opencv-python-headless were not installed
    code, _, err = run_cli(capsys, "run", "--model", "groot-tiny", "--no-progress")
    assert code == 2
    assert "pip install 'embodied-accel[groot]'" in err and "opencv-python-headless" in err
    assert "No module named" not in err


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["run", "--preset", "groot-tiny"], "--model groot-tiny"),
        (["reconstruct", "--preset", "vggt-tiny"], "--model vggt-tiny"),
    ],
)
def test_a_preset_without_a_checkpoint_names_the_flag_for_it(capsys, argv, hint):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and hint in err


def test_a_groot_checkpoint_of_the_tiny_size_loads_or_names_groot_tiny():
    from groot_fixture import DIR

    from embodied_accel.errors import CheckpointError
    from embodied_accel.models.groot.weights import config_from_checkpoint

    try:
        config_from_checkpoint(DIR)  # no preset given
    except CheckpointError as exc:
        assert "--preset groot-tiny" in str(exc)


def test_a_vggt_checkpoint_of_the_tiny_size_loads_or_names_vggt_tiny(tmp_path):
    import shutil

    from embodied_accel.errors import CheckpointError
    from embodied_accel.models.vggt.config import get_preset
    from embodied_accel.models.vggt.loading import load_vggt_model

    tiny = get_preset("vggt-tiny")
    shutil.copy(REPO / "tests/fixtures/vggt_tiny/model.safetensors", tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(
        json.dumps({"img_size": tiny.image_size, "patch_size": tiny.patch_size, "embed_dim": tiny.width})
    )
    try:
        load_vggt_model(tmp_path, device="cpu", backend="reference", progress=False)  # no preset given
    except CheckpointError as exc:
        assert "--preset vggt-tiny" in str(exc)


# ---------------------------------------------------------------------------------------------------------------
# run, load_policy
# ---------------------------------------------------------------------------------------------------------------


def test_run_shows_a_warm_latency_beside_the_first_call(capsys, tmp_path):
    out_file = tmp_path / "actions.json"
    code, out, err = run_cli(capsys, "run", "--num-steps", "2", "--no-progress", "--output", out_file)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("latency:"))
    assert re.search(r"warm \d+\.\d ms \(second call", line) and re.search(r"first call \d+\.\d ms \(cold", line)
    assert json.loads(out_file.read_text())["warm_infer_ms"] > 0


def test_load_policy_prints_no_progress_bar_unless_asked(tmp_path, capsys):
    pytest.importorskip("pyarrow", reason="the checkpoint writer comes with the [train] extra")
    from lerobot_data import make_base_checkpoint

    import embodied_accel

    checkpoint = make_base_checkpoint(tmp_path / "base")
    capsys.readouterr()
    embodied_accel.load_policy(str(checkpoint), backend="reference")
    assert "loading weights" not in capsys.readouterr().err
    embodied_accel.load_policy(str(checkpoint), backend="reference", progress=True)
    assert "loading weights" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# profile
# ---------------------------------------------------------------------------------------------------------------


def test_profile_counts_the_ops_bench_counts_and_explains_the_trace_count(capsys, tmp_path):
    common = ["--num-steps", "2", "--no-progress", "--backend", "reference"]
    code, _, err = run_cli(capsys, "bench", *common, "--runs", "1", "--warmup", "1", "--no-stages", "--out-dir",
                           tmp_path / "bench")  # fmt: skip
    assert code == 0, err
    bench = json.loads(next((tmp_path / "bench").glob("*.json")).read_text())
    code, out, err = run_cli(capsys, "profile", *common, "--calls", "1", "--warmup", "1", "--out-dir",
                             tmp_path / "profile")  # fmt: skip
    assert code == 0, err
    summary = json.loads(next((tmp_path / "profile").glob("*/summary.json")).read_text())
    assert summary["aten_ops_per_call"] == bench["aten_ops_per_call"]
    assert summary["aten_ops_method"] == bench["aten_ops_method"] == "dispatch_mode"
    assert f"aten ops:      {bench['aten_ops_per_call']} per call" in out
    assert "top-level aten ops in the trace" in out and "a composite op" in out


def test_profile_without_matplotlib_names_the_extra_and_writes_the_rest(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run_cli(capsys, "profile", "--num-steps", "1", "--calls", "1", "--warmup", "0",
                             "--no-progress", "--out-dir", tmp_path)  # fmt: skip
    assert code == 0, err
    assert "no chart: matplotlib is not installed (pip install 'embodied-accel[profile]')" in out
    assert "pip install 'embodied-accel[profile]'" in err  # said before the work too
    run_dir = next(tmp_path.iterdir())
    assert (run_dir / "summary.json").is_file() and (run_dir / "trace.json").is_file()
    assert not (run_dir / "breakdown.png").exists()


# ---------------------------------------------------------------------------------------------------------------
# train with no dataset
# ---------------------------------------------------------------------------------------------------------------


def test_default_workers_leave_a_core_to_the_training_loop():
    from embodied_accel.train.config import TrainSettings, available_cores

    workers = TrainSettings().workers
    assert workers <= available_cores() - 1 or workers == 0
    assert workers == min(4, available_cores() - 1)


def test_a_short_run_logs_enough_points_for_its_curve():
    from embodied_accel.train.config import TrainSettings

    assert TrainSettings(steps=20).log_interval == 1
    assert TrainSettings(steps=100).log_interval == 5
    assert TrainSettings(steps=30000).log_interval == 10
    assert TrainSettings(steps=20, log_every=7).log_interval == 7


def test_the_loss_curve_of_a_few_steps_is_readable():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from embodied_accel.train.report import loss_figure

    records = [{"step": s, "loss": 2.0 - 0.1 * s, "lr": 1e-3, "samples_per_s": 3.0} for s in (1, 2, 3)]
    figure = loss_figure(records)
    loss_axis = figure.axes[0]
    assert loss_axis.get_yscale() == "linear"  # 1.7 .. 1.9: a log axis would label it 1.8 x 10^0
    assert all(float(t).is_integer() for t in loss_axis.get_xticks())
    assert loss_axis.lines[0].get_marker() == "o"
    single = loss_figure(records[:1]).axes[0]
    assert single.get_xlim()[0] <= 0 and single.get_xlim()[1] >= 2  # one record still has whole steps around it
    plt.close("all")


def test_train_with_no_dataset_writes_a_checkpoint_that_run_runs(capsys, tmp_path):
    pytest.importorskip("pyarrow", reason="the [train] extra (pyarrow) is not installed")
    pytest.importorskip("av", reason="the [train] extra (PyAV) is not installed")
    out = tmp_path / "sample"
    code, printed, err = run_cli(capsys, "train", "--out", out, "--steps", "2", "--batch-size", "2", "--workers", "0",
                                 "--no-progress")  # fmt: skip
    assert code == 0, err
    assert "built-in sample dataset" in printed
    assert (out / "sample_dataset" / "meta" / "info.json").is_file()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # a record per step in the sample run
    checkpoint = out / "checkpoints" / "last" / "pretrained_model"
    assert f"embodied-accel run --checkpoint {out.resolve() / 'checkpoints/last/pretrained_model'}" in printed
    code, printed, err = run_cli(capsys, "run", "--checkpoint", checkpoint, "--num-steps", "2", "--no-warm-call",
                                 "--no-progress")  # fmt: skip
    assert code == 0, err
    assert "shape (50, 7)" in printed and "RANDOM" not in printed
    assert "(instruction: text 'pick up the red block'" in printed  # the checkpoint's own tokenizer


def test_the_sample_dataset_has_the_sample_observations_keys(tmp_path):
    pytest.importorskip("pyarrow", reason="the [train] extra (pyarrow) is not installed")
    pytest.importorskip("av", reason="the [train] extra (PyAV) is not installed")
    import numpy as np

    from embodied_accel.data.lerobot_dataset import LeRobotDataset
    from embodied_accel.data.sample_dataset import sample_episodes, write_sample_dataset

    dataset = LeRobotDataset(write_sample_dataset(tmp_path / "ds", num_episodes=2, length=5))
    with np.load(cli.SAMPLE_OBSERVATION) as sample:
        cameras = sorted(k for k in sample.files if k.startswith("observation.images."))
        state_dim = sample["observation.state"].shape[0]
    assert sorted(dataset.camera_keys) == cameras
    assert dataset.features["observation.state"].shape == (state_dim,)
    assert dataset.features["action"].shape == (7,) and dataset.num_frames == 10
    first, second = sample_episodes(num_episodes=2, length=5)
    # the block lies elsewhere in each episode: the actions follow the images
    assert not np.allclose(first.columns["action"], second.columns["action"])


# ---------------------------------------------------------------------------------------------------------------
# eval libero: the default plan and progress (the harness's own fakes; the real simulator: test_eval_libero.py)
# ---------------------------------------------------------------------------------------------------------------


def test_eval_libero_by_default_runs_one_episode_per_task():
    assert cli.build_parser().parse_args(["eval", "libero", "--suite", "spatial"]).episodes == 1


def test_the_harness_reports_every_step_and_every_episode(capsys):
    from test_eval_harness import PointSimulator, _seeking_policy

    from embodied_accel.eval.rollout import Episode, run_episodes

    class TimedSimulator(PointSimulator):
        def episode_timing(self) -> str:
            return "0.01 s per step"

    lines: list[str] = []
    episodes = [Episode(0, 3, 0, 0), Episode(1, 9, 0, 1)]  # the first succeeds after 3 steps, the second times out
    run_episodes([TimedSimulator([])], episodes, _seeking_policy([]), lambda raw, ep: raw, max_steps=6,
                 replan_every=2, progress=True, report=lines.append)  # fmt: skip
    assert lines[0] == "episode 1/2: task 3, initial state 0"
    assert re.fullmatch(r"episode 1/2: success after 3 steps, \d+\.\d s \(0\.01 s per step\)", lines[1]), lines[1]
    assert lines[2] == "episode 2/2: task 9, initial state 0"
    assert re.fullmatch(r"episode 2/2: failure after 6 steps, \d+\.\d s \(0\.01 s per step\)", lines[3]), lines[3]
    assert len(lines) == 4
    # a bar of control steps: 3 + 6, its total shrunk by the 3 steps the first episode did not need
    assert "9/9" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# reconstruct
# ---------------------------------------------------------------------------------------------------------------


def test_reconstruct_reads_its_frames_before_the_checkpoint(capsys, tmp_path):
    frames = tmp_path / "frames"
    frames.mkdir()
    (frames / "a.png").write_bytes(b"not an image")
    code, _, err = run_cli(capsys, "reconstruct", frames, "--checkpoint", tmp_path / "missing", "-o",
                           tmp_path / "scene.ply")  # fmt: skip
    assert code == 2 and "a.png: not a readable image" in err


def test_reconstruct_says_once_that_the_weights_are_random(capsys, caplog, tmp_path):
    pytest.importorskip("PIL", reason="the [vggt] extra (Pillow) is not installed")
    code, out, err = run_cli(capsys, "reconstruct", "-o", tmp_path / "scene.ply", "--no-progress")
    assert code == 0, err
    said = out + err + "".join(record.getMessage() for record in caplog.records)
    assert said.lower().count("random weights") == 1, said
