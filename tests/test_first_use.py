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
