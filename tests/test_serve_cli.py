"""``embodied-accel serve`` and ``embodied-accel loadtest``: a real process stopped by signals, a small load test."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embodied_accel import cli
from embodied_accel.serve.client import PolicyClient, http_get

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
    assert record["server_rss_before_mb"] > 0 and record["server_rss_after_mb"] > 0
    assert record["model_calls"] <= 12 and record["server_in_process"] is True and record["note"] == "ci"
    assert record["device"] and record["versions"]["torch"] and record["batch"] == 4


def test_serve_process_answers_and_stops_on_signals(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for sig in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen(
            [sys.executable, "-m", "embodied_accel.cli", "--log-level", "INFO", "serve", "--host", "127.0.0.1",
             "--port", "0", "--num-steps", "1", "--keymap", "libero", "--log-json", "--no-progress"],
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
