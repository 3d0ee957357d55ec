"""``embodied-accel serve`` and ``embodied-accel loadtest``: a real process stopped by signals, a small load test."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tolerances import pi0_tolerance

pytest.importorskip("websockets", reason="the [serve] extra (websockets) is not installed")
from embodied_accel import cli  # noqa: E402
from embodied_accel.serve.client import PolicyClient, http_get  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["serve", "--max-batch", "0"], "integer >= 1"),
        (["serve", "--batch-wait-ms", "-1"], "number >= 0"),
        (["serve", "--request-timeout-s", "0"], "number > 0"),
        (["serve", "--drain-timeout", "0"], "number > 0"),
        (["serve", "--default-token-ids", "2,x"], "comma-separated token ids"),
        (["serve", "--port", "70000"], "port must be in 0..65535"),
        (["serve", "--keymap", "robot.json", "--port", "0"], "neither one of auto, identity, libero, aloha, droid"),
        (["loadtest", "--clients", "0"], "integer >= 1"),
        (["loadtest", "--warmup", "-1"], "integer >= 0"),
    ],
)
def test_argument_errors_exit_2(capsys, argv, fragment):
    code, _, err = run_cli(capsys, *argv, "--no-progress")
    assert code == 2 and fragment in err and "Traceback" not in err


def test_loadtest_against_an_unreachable_url_exits_2(capsys):
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = run_cli(capsys, "loadtest", "--url", f"ws://127.0.0.1:{port}", "--timeout-s", "2")
    assert code == 2 and "cannot reach the policy server" in err


def test_loadtest_in_process_writes_a_result(capsys, tmp_path):
    code, out, err = run_cli(
        capsys, "loadtest", "--clients", "3", "--requests", "4", "--warmup", "1", "--num-steps", "1",
        "--max-batch", "4", "--out-dir", str(tmp_path), "--no-progress", "--note", "ci",
    )  # fmt: skip
    assert code == 0, err
    assert "3 clients x 4 = 12 (12 ok, 0 errors)" in out and "p99" in out and "requests/s" in out
    (path,) = tmp_path.glob("*_loadtest_pi0-tiny_reference_eager_float32_c3x4_b4_*.json")
    record = json.loads(path.read_text())
    assert record["kind"] == "loadtest" and record["errors"] == 0 and record["ok"] == 12 and record["runs"] == 12
    assert record["clients"] == 3 and record["requests_per_client"] == 4 and record["steps"] == 1
    assert 0 < record["p50_ms"] <= record["p99_ms"] and record["throughput_rps"] > 0
    assert 0 < record["server_rss_before_mb"] <= record["server_rss_peak_mb"] == record["peak_mem_mb"]
    assert 0 < record["server_rss_final_mb"] <= record["server_rss_peak_mb"] and "server_rss_after_mb" not in record
    assert record["model_calls"] <= 12 and record["server_in_process"] is True and record["note"] == "ci"
    assert record["device"] and record["versions"]["torch"] and record["batch"] == 4


def test_serve_process_answers_and_stops_on_signals(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for sig in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen(
            [sys.executable, "-m", "embodied_accel.cli", "--log-level", "INFO", "serve", "--host", "127.0.0.1",
             "--port", "0", "--num-steps", "1", "--keymap", "libero", "--default-token-ids", "2,3", "--log-json",
             "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        )  # fmt: skip
        try:
            line = process.stdout.readline()
            match = re.search(r"on (ws://127\.0\.0\.1:\d+)", line)
            assert match, (line, process.stderr.read() if process.poll() is not None else "")
            url = match.group(1)
            assert http_get(url, "/healthz")[0] == 200
            with PolicyClient(url) as client:
                obs = {
                    "observation/image": np.zeros((32, 32, 3), np.uint8),
                    "observation/state": np.zeros(8, np.float32),
                    "observation.language.tokens": np.array([2, 3], np.int64),
                }
                assert client.infer(obs)["actions"].shape == (50, 7)
            process.send_signal(sig)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, err
        assert out.strip().endswith("stopped")
        events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        names = [event.get("event") for event in events]
        assert {"serving", "connection_opened", "signal", "shutting_down", "stopped"} <= set(names), names
        assert next(e for e in events if e.get("event") == "signal")["signal"] == sig.name


def test_loadtest_against_a_running_server(capsys):
    from embodied_accel import load_policy
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = load_policy("pi0-tiny", progress=False)
    with ServerThread(PolicyServer(policy, ServeConfig(host="127.0.0.1", port=0, num_steps=1))) as running:
        code, out, err = run_cli(
            capsys, "loadtest", "--url", running.url, "--clients", "2", "--requests", "3", "--no-write"
        )
    assert code == 0, err
    assert "2 clients x 3 = 6 (6 ok, 0 errors)" in out and "wrote" not in out


def test_serve_refuses_to_start_when_it_cannot_read_any_instruction(tmp_path):
    """A checkpoint whose tokenizer is nowhere to be found: without token ids to fall back on, every openpi request
    (text prompt) would fail."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_CACHE": str(tmp_path / "empty_hub")}
    checkpoint = Path(__file__).parent / "fixtures" / "pi0_tiny"
    for extra, fragment in (
        ([], "--default-token-ids"),
        (["--default-prompt", "pick up the cube"], "--default-prompt needs a tokenizer"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "embodied_accel.cli", "serve", "--checkpoint", str(checkpoint), "--port", "0",
             "--no-progress", *extra],
            check=False, capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
        assert fragment in done.stderr and "--tokenizer" in done.stderr and "Traceback" not in done.stderr


def test_default_token_ids_answer_openpi_requests_with_a_text_prompt(tmp_path, monkeypatch):
    from embodied_accel import load_policy
    from embodied_accel.cli import serve as commands
    from embodied_accel.serve.server import PolicyServer, ServerThread

    args = cli.build_parser().parse_args(
        [
            "serve",
            "--port",
            "0",
            "--host",
            "127.0.0.1",
            "--num-steps",
            "1",
            "--noise-seed",
            "0",
            "--default-token-ids",
            "2,7,9",
        ]
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub"))  # a checkpoint whose tokenizer is nowhere
    policy = load_policy(str(Path(__file__).parent / "fixtures" / "pi0_tiny"), progress=False)
    assert not policy.text_instructions_supported
    config = commands.serve_config(args)
    commands.check_instruction_source(policy, config)  # passes: there are token ids to fall back on
    assert config.default_token_ids == (2, 7, 9) and config.drain_timeout_s == 30.0
    with ServerThread(PolicyServer(policy, config)) as running, PolicyClient(running.url) as client:
        obs = {
            "observation/image": np.zeros((32, 32, 3), np.uint8),
            "observation/state": np.zeros(8, np.float32),
            "prompt": "pick up the cube",  # what openpi robots send; unusable without a tokenizer
        }
        actions = client.infer(obs)["actions"]
    model_obs = {
        policy.io.image_keys[0]: obs["observation/image"],
        "observation.state": obs["observation/state"],
        "observation.language.tokens": np.array([2, 7, 9], np.int64),
    }
    expected = policy.infer(model_obs, num_steps=1, seed=0)["actions"]
    # the server's batch of one may block its GEMMs otherwise than infer's call: the same sums in another order
    np.testing.assert_allclose(actions, expected, rtol=0, atol=pi0_tolerance(policy.config) * np.abs(expected).max())


MISSING_EXTRA = """
import sys
sys.modules[{module!r}] = None  # as if the [serve] extra were not installed
from embodied_accel import cli
sys.exit(cli.main({argv!r}))
"""


@pytest.mark.parametrize("module", ["websockets", "msgpack"])
@pytest.mark.parametrize("command", ["serve", "loadtest"])
def test_commands_name_the_serve_extra_when_it_is_missing(module, command):
    argv = [command, "--no-progress", "--port", "0"] if command == "serve" else [command, "--url", "ws://127.0.0.1:9"]
    done = subprocess.run(
        [sys.executable, "-c", MISSING_EXTRA.format(module=module, argv=argv)],
        check=False, capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "pip install 'embodied-accel[serve]'" in done.stderr and module in done.stderr
    assert "Traceback" not in done.stderr


def test_loadtest_records_the_peak_of_the_sampled_server_memory(monkeypatch):
    """The server's RSS as /metrics reports it: 100 MB before, 700 MB while the load runs, 200 MB at the end."""
    from embodied_accel.serve import loadtest
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    class Slow:
        def infer_batch(self, observations, **kwargs):
            time.sleep(0.05)
            return {"actions": np.zeros((len(observations), 2, 1), np.float32)}

    real_read = loadtest.read_metrics
    readings: list[str] = []

    def scripted(url):
        samples = real_read(url)
        readings.append("x")
        mb = 100 if len(readings) == 1 else 700 if len(readings) < 4 else 200
        samples["process_resident_memory_bytes"] = mb * 2**20
        return samples

    monkeypatch.setattr(loadtest, "read_metrics", scripted)
    with ServerThread(PolicyServer(Slow(), ServeConfig(host="127.0.0.1", port=0))) as running:
        stats = loadtest.run_loadtest(
            running.url, clients=2, requests=10, warmup=0, observation={"x": np.float32(0)}, rss_interval_s=0.02
        )
    assert stats["server_rss_before_mb"] == 100 and stats["server_rss_final_mb"] == 200
    assert stats["server_rss_peak_mb"] == 700 and stats["server_rss_samples"] >= 3
