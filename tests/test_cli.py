"""The ``embodied-accel`` command: argument and file errors, and real end-to-end runs of run / info / bench."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embodied_accel import cli
from embodied_accel.bench.harness import RESULT_KEYS

try:
    from embodied_accel import load_policy
except ImportError:  # the policy layer is written in parallel with the CLI
    load_policy = None

needs_policy = pytest.mark.skipif(load_policy is None, reason="embodied_accel.load_policy cannot be imported")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def load_sample():
    with np.load(cli.SAMPLE_OBSERVATION) as data:
        return {key: data[key] for key in data.files}


# ---------------------------------------------------------------------------------------------------------------
# Errors: message on stderr, exit code 2, no traceback
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, fragment",
    [
        ([], "COMMAND"),
        (["fly"], "invalid choice"),
        (["run", "--dtype", "float64"], "--dtype"),
        (["run", "--model", "pi9"], "--model"),
        (["run", "--backend", "tpu"], "--backend"),
        (["run", "--num-steps", "0"], "integer >= 1"),
        (["run", "--noise", "n.npy", "--seed", "1"], "not allowed with"),
        (["run", "--model", "pi0-tiny", "--checkpoint", "x"], "not allowed with"),
        (["bench", "--batch", "-1"], "integer >= 1"),
        (["bench", "--warmup", "x"], "integer"),
        (["--log-level", "LOUD", "info"], "--log-level"),
        (["info", "--log-level", "LOUD"], "--log-level"),
        (["run", "--seed", "99999999999999999999"], "argument --seed: expected an integer in [0, 2**64 - 1]"),
        (["run", "--seed", "-1"], "argument --seed"),
    ],
)
def test_argument_errors_exit_2_with_a_message(capsys, argv, fragment):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert fragment in err and "usage:" not in err and err.count("\n") == 1 and "--help)" in err  # one line
    assert "Traceback" not in err


def test_help_exits_0(capsys):
    code, out, _ = run_cli(capsys, "run", "--help")
    assert code == 0 and "--observation" in out


def test_version(capsys):
    import platform

    import torch

    from embodied_accel import __version__

    code, out, _ = run_cli(capsys, "--version")
    assert code == 0
    assert out == f"embodied-accel {__version__} (torch {torch.__version__}, Python {platform.python_version()})\n"


@pytest.mark.parametrize(
    "argv, level",
    [
        (["info"], "WARNING"),
        (["--log-level", "INFO", "info"], "INFO"),
        (["info", "--log-level", "debug"], "DEBUG"),  # after the subcommand, as the README says
        (["--log-level", "ERROR", "bench", "--log-level", "INFO"], "INFO"),  # the later one wins
    ],
)
def test_log_level_before_or_after_the_subcommand(argv, level):
    assert cli.build_parser().parse_args(argv).log_level == level


def test_seed_accepts_the_whole_generator_range():
    args = cli.build_parser().parse_args(["run", "--seed", str(2**64 - 1)])
    assert args.seed == 2**64 - 1


@pytest.mark.parametrize(
    "make_args, fragment",
    [
        (lambda tmp: ["run", "--observation", str(tmp / "missing.npz")], "no such file"),
        (lambda tmp: ["run", "--observation", str(tmp / "obs.txt")], "expected a .npz or .json"),
        (lambda tmp: ["run", "--observation", str(tmp / "garbage.npz")], "not a .npz archive"),
        (lambda tmp: ["run", "--observation", str(tmp / "bad.json")], "not a readable JSON"),
        (lambda tmp: ["run", "--noise", str(tmp / "missing.npy")], "no such file"),
        (lambda tmp: ["run", "--noise", str(tmp / "obs.txt")], "expected a .npy"),
        (lambda tmp: ["run", "--output", str(tmp / "actions.csv")], "expected a .npy or .json"),
        (lambda tmp: ["bench", "--observation", str(tmp / "missing.json")], "no such file"),
    ],
)
def test_file_errors_exit_2_naming_the_file(capsys, tmp_path, make_args, fragment):
    (tmp_path / "obs.txt").write_text("x")
    (tmp_path / "garbage.npz").write_bytes(b"not a zip")
    (tmp_path / "bad.json").write_text("{nope")
    code, _, err = run_cli(capsys, *make_args(tmp_path))
    assert code == 2
    assert fragment in err and "error:" in err
    assert "Traceback" not in err


def test_json_observation_values_are_converted():
    obs = {"observation.images.cam": [[[0, 128, 255]]], "observation.state": [1, 2.5], "task": "x", "ids": [1, 2]}
    converted = {k: cli._json_value(Path("o.json"), k, v) for k, v in obs.items()}
    assert converted["observation.images.cam"].dtype == np.uint8
    assert converted["observation.state"].dtype == np.float32
    assert converted["task"] == "x" and converted["ids"].dtype.kind == "i"
    with pytest.raises(cli.CLIError, match="0..255"):
        cli._json_value(Path("o.json"), "observation.images.cam", [[[300, 0, 0]]])


def test_bundled_sample_observation_is_what_the_generator_makes():
    path = REPO / "tools" / "make_sample_observation.py"
    spec = importlib.util.spec_from_file_location("make_sample_observation", path)
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    expected = generator.sample_observation()
    bundled = load_sample()
    assert set(bundled) == set(expected)
    for key, value in expected.items():
        assert bundled[key].dtype == value.dtype and np.array_equal(bundled[key], value), key
    assert bundled["observation.images.base_0_rgb"].shape == (240, 320, 3)
    assert bundled["observation.state"].shape == (8,)
    assert str(bundled["task"]) == "pick up the red block"
    assert bundled["observation.language.tokens"].max() < 1024
    assert cli.SAMPLE_OBSERVATION.stat().st_size < 300 * 1024


# ---------------------------------------------------------------------------------------------------------------
# End to end with the real policy
# ---------------------------------------------------------------------------------------------------------------


@needs_policy
def test_run_default_prints_random_weights_notice_and_shape(capsys):
    code, out, err = run_cli(capsys, "run", "--no-progress")
    assert code == 0, err
    assert "RANDOM WEIGHTS" in out and "not a trained policy" in out
    assert "pi0-tiny" in out and "backend reference" in out and "dtype float32" in out
    assert "shape (50, 7)" in out
    assert "first action" in out and "latency:" in out
    assert "(instruction: text 'pick up the red block'" in out  # the bundled tiny tokenizer


@needs_policy
def test_module_entry_point_runs_in_a_subprocess(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "embodied_accel.cli", "run", "--num-steps", "2", "--no-progress", "--log-level", "INFO"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "RANDOM WEIGHTS" in done.stdout and "shape (50, 7)" in done.stdout
    assert (done.stdout + done.stderr).count("not a trained policy") == 1  # the notice once, not also a warning
    assert "INFO embodied_accel.models.pi0.tokenizer: pi0-tiny: tokenizer " in done.stderr  # --log-level after run
    assert "about 1.2 MiB of weights in float32" in done.stderr


@needs_policy
def test_same_seed_same_actions_other_seed_other_actions(capsys, tmp_path):
    paths = [tmp_path / name for name in ("a.npy", "b.npy", "c.npy")]
    for path, seed in zip(paths, ("7", "7", "8"), strict=True):
        code, _, err = run_cli(capsys, "run", "--seed", seed, "--num-steps", "2", "--output", str(path))
        assert code == 0, err
    a, b, c = (np.load(p) for p in paths)
    assert a.shape == (50, 7) and a.dtype == np.float32
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


@needs_policy
def test_noise_file_is_honored(capsys, tmp_path):
    noise = np.random.default_rng(3).standard_normal((50, 32)).astype(np.float32)
    np.save(tmp_path / "noise.npy", noise)
    code, out, err = run_cli(
        capsys, "run", "--noise", str(tmp_path / "noise.npy"), "--num-steps", "2", "--output", str(tmp_path / "a.npy")
    )
    assert code == 0, err
    assert "noise:       file" in out
    policy = load_policy("pi0-tiny", progress=False)
    observation, _ = cli.select_instruction(policy, cli.load_observation(cli.SAMPLE_OBSERVATION))
    expected = policy.infer(observation, noise=noise, num_steps=2)["actions"]
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), expected)


@needs_policy
def test_wrong_noise_shape_and_missing_observation_key_exit_2(capsys, tmp_path):
    np.save(tmp_path / "noise.npy", np.zeros((50, 7), np.float32))
    code, _, err = run_cli(capsys, "run", "--noise", str(tmp_path / "noise.npy"))
    assert code == 2 and "noise" in err and "[50, 32]" in err and "Traceback" not in err

    sample = load_sample()
    del sample["observation.state"]
    np.savez(tmp_path / "obs.npz", **sample)
    code, _, err = run_cli(capsys, "run", "--observation", str(tmp_path / "obs.npz"))
    assert code == 2 and "observation.state" in err and "Traceback" not in err


@needs_policy
def test_json_observation_and_json_output(capsys, tmp_path):
    sample = load_sample()
    obs = {k: (str(v) if k == "task" else v.tolist()) for k, v in sample.items()}
    (tmp_path / "obs.json").write_text(json.dumps(obs))
    code, _, err = run_cli(
        capsys,
        "run",
        "--observation",
        str(tmp_path / "obs.json"),
        "--num-steps",
        "2",
        "--output",
        str(tmp_path / "actions.json"),
    )
    assert code == 0, err
    written = json.loads((tmp_path / "actions.json").read_text())
    assert written["shape"] == [50, 7] and np.asarray(written["actions"]).shape == (50, 7)
    assert written["random_weights"] is True and written["num_steps"] == 2
    code, _, err = run_cli(capsys, "run", "--num-steps", "2", "--output", str(tmp_path / "actions.npy"))
    assert code == 0, err
    # the same call twice (deterministic on the CPU); JSON's shortest float repr rounds back to the same float32
    np.testing.assert_array_equal(np.load(tmp_path / "actions.npy"), np.asarray(written["actions"], np.float32))


@needs_policy
def test_checkpoint_run_has_no_random_weights_notice(capsys):
    code, out, err = run_cli(
        capsys, "run", "--checkpoint", str(FIXTURES / "pi0_tiny"), "--preset", "pi0-tiny", "--num-steps", "2"
    )
    assert code == 0, err
    assert "RANDOM" not in out and "checkpoint" in out and "shape (50, 7)" in out


@needs_policy
def test_reduced_checkpoint_runs_without_preset_and_a_wrong_preset_is_summarized(capsys):
    code, out, err = run_cli(capsys, "run", "--checkpoint", str(FIXTURES / "pi05_tiny"), "--num-steps", "1")
    assert code == 0, err
    assert "pi05-tiny (family pi05), checkpoint" in out and "shape (50, 7)" in out
    code, _, err = run_cli(capsys, "info", "--checkpoint", str(FIXTURES / "pi05_tiny"), "--preset", "pi0-tiny")
    assert code == 2 and "checkpoint is a pi05 policy but preset 'pi0-tiny' is pi0" in err
    code, _, err = run_cli(capsys, "info", "--checkpoint", str(FIXTURES / "pi05_tiny"), "--preset", "pi05")
    assert code == 2 and "Traceback" not in err
    assert "  - VLM width: 64 in the checkpoint, 2048 in preset 'pi05'" in err and "pass --preset pi05-tiny" in err
    assert len(err.splitlines()) < 80


def test_git_lfs_pointer_checkpoint_is_named(capsys, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "pi0_tiny", ckpt)
    (ckpt / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n")
    code, _, err = run_cli(capsys, "info", "--checkpoint", str(ckpt))
    assert code == 2 and "Traceback" not in err
    assert "this is a git-lfs pointer" in err and f"run `git lfs pull` in {ckpt.resolve()}" in err


# ---------------------------------------------------------------------------------------------------------------
# The instruction: text or token ids, and where the tokenizer came from
# ---------------------------------------------------------------------------------------------------------------


def write_observation(tmp_path, **changes):
    observation = {key: value for key, value in load_sample().items()}
    observation.update(changes)
    observation = {key: value for key, value in observation.items() if value is not None}
    np.savez(tmp_path / "obs.npz", **observation)
    return str(tmp_path / "obs.npz")


@needs_policy
def test_text_and_token_ids_together_warn_which_one_is_used(capsys, caplog, tmp_path, monkeypatch):
    path = write_observation(tmp_path)  # the sample's text and token ids, as a user's file
    with caplog.at_level("INFO", logger="embodied_accel"):
        code, out, err = run_cli(capsys, "run", "--observation", path, "--num-steps", "1")
    assert code == 0, err
    (record,) = [r for r in caplog.records if "gives the instruction twice" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert record.getMessage() == (
        f"{path} gives the instruction twice: using the text 'pick up the red block' ('task') (tokenized by "
        f"{cli.SAMPLE_OBSERVATION.parent / 'tiny_tokenizer.model'}), ignoring the token ids "
        "('observation.language.tokens')"
    )
    assert "(instruction: text 'pick up the red block'; its token ids unused)" in out

    caplog.clear()  # the bundled sample carries both on purpose: said at INFO only
    with caplog.at_level("INFO", logger="embodied_accel"):
        code, _, err = run_cli(capsys, "run", "--num-steps", "1", "--log-level", "INFO")
    assert code == 0, err
    (record,) = [r for r in caplog.records if "gives the instruction twice" in r.getMessage()]
    assert record.levelname == "INFO" and record.getMessage().startswith("the bundled sample gives")

    caplog.clear()  # no tokenizer: the token ids are used and the text is the one ignored
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with caplog.at_level("WARNING", logger="embodied_accel"):
        code, out, err = run_cli(capsys, "run", "--checkpoint", str(FIXTURES / "pi0_tiny"), "--observation", path)
    assert code == 0, err
    assert (
        f"{path} gives the instruction twice: using the token ids ('observation.language.tokens') (the policy has "
        "no tokenizer), ignoring the text 'pick up the red block' ('task')" in caplog.text
    )


@needs_policy
def test_text_without_a_tokenizer_names_the_places_searched(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    path = write_observation(tmp_path, **{"observation.language.tokens": None})
    code, _, err = run_cli(capsys, "run", "--checkpoint", str(FIXTURES / "pi0_tiny"), "--observation", path)
    assert code == 2 and "Traceback" not in err
    assert "the instruction is text ('task') but pi0-tiny has no tokenizer; searched: " in err
    assert f"{FIXTURES / 'pi0_tiny' / 'tokenizer.model'} (absent)" in err
    assert f"{tmp_path / 'hub' / 'models--google--paligemma-3b-pt-224'} (no tokenizer.model)" in err
    assert "Pass --tokenizer FILE" in err


@needs_policy
def test_info_names_the_tokenizer(capsys):
    code, out, err = run_cli(capsys, "info")
    assert code == 0, err
    assert f"tokenizer:   {cli.SAMPLE_OBSERVATION.parent / 'tiny_tokenizer.model'} (512 pieces)" in out


@pytest.mark.compile
@needs_policy
def test_captured_modes_announce_the_first_call_before_it_runs(capsys, monkeypatch):
    from embodied_accel.families import policy as policy_family

    # as --capture compile builds it; the call itself is stubbed (compiling takes ~45 s)
    policy = load_policy("pi0-tiny", progress=False, capture="compile")
    stderr_at_call = []

    def first_call(observation, **kwargs):
        stderr_at_call.append(capsys.readouterr().err)
        return {"actions": np.zeros((50, 7), np.float32), "infer_ms": 1.0}

    monkeypatch.setattr(policy, "infer", first_call)
    monkeypatch.setattr(policy_family, "load_policy_from_args", lambda args, **kwargs: (policy, 0.0))
    code, _, err = run_cli(capsys, "run", "--capture", "compile")
    assert code == 0, err
    announcement = (
        "embodied-accel run: compiling the call for this shape with torch.compile (first call only; this can take "
        "a minute) ...\n"
    )
    assert stderr_at_call == [announcement, ""]  # the second, warm call is not announced


@needs_policy
def test_info_lists_parameter_count_backend_and_io(capsys):
    code, out, err = run_cli(capsys, "info")
    assert code == 0, err
    n = load_policy("pi0-tiny", progress=False).num_parameters()
    assert f"({n:,})" in out
    assert "backend reference" in out
    assert "observation.images.base_0_rgb" in out and "8 dims" in out and "7 dims" in out
    assert "RANDOM" in out


@needs_policy
def test_bench_writes_a_result_file_with_every_key(capsys, tmp_path):
    code, out, err = run_cli(
        capsys, "bench", "--runs", "3", "--warmup", "1", "--num-steps", "2", "--out-dir", str(tmp_path), "--no-progress"
    )
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    assert str(path) in out and "mean" in out and "aten ops/call" in out
    record = json.loads(path.read_text())
    assert set(RESULT_KEYS) <= set(record)
    assert record["model"] == "pi0" and record["preset"] == "pi0-tiny" and record["backend"] == "reference"
    assert record["runs"] == 3 and record["steps"] == 2 and record["batch"] == 1 and record["views"] == 2
    assert record["capture"] == "eager" and record["dtype"] == "float32"
    assert record["aten_ops_per_call"] > 0 and record["peak_mem_mb"] > 0
    assert record["mean_ms"] > 0 and record["p50_ms"] <= record["p90_ms"]
    assert record["random_weights"] is True and record["warmup"] == 1 and record["first_call_ms"] > 0
    assert {"stage_vision_ms", "stage_prefix_ms", "stage_denoise_ms"} <= set(record)
    assert f"first call: {record['first_call_ms']:.1f} ms" in out
    assert f"end to end: p50 {record['end_to_end_p50_ms']:.2f} ms" in out
    phases = [line.removeprefix("embodied-accel bench: ") for line in err.splitlines() if line.startswith("embodied")]
    counting = phases.pop(2)
    assert counting.startswith("counting the aten ops of one call (two calls, each slower than a timed one's ")
    assert phases == [
        "first call (warm-up, timed apart) ...",
        "0 more warm-up call(s), then 3 timed runs ...",
        "end to end: 1 run(s) from observation dicts (+ host validation, tokenization) ...",
        "per-stage split (vision, prefix, denoise), 3 timed runs each ...",
    ]


@needs_policy
def test_bench_batch_and_views(capsys, tmp_path):
    code, _, err = run_cli(
        capsys,
        "bench",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--num-steps",
        "1",
        "--batch",
        "2",
        "--views",
        "3",
        "--no-stages",
        "--out-dir",
        str(tmp_path),
    )
    assert code == 0, err
    (path,) = tmp_path.glob("*_b2_v3_*.json")
    record = json.loads(path.read_text())
    assert record["batch"] == 2 and record["views"] == 3 and record["first_call_ms"] is None
    assert not [key for key in record if key.startswith("stage_")]
