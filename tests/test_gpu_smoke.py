"""The first GPU session's script (``tools/gpu_smoke.sh``) in its ``--cpu`` mode: the same steps on the tiny presets, so
that the script a GPU machine runs cannot rot; and a step stopped at its time limit still reports and keeps its log."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from embodied_accel.bench.harness import RESULT_KEYS

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("env", "pi0", "tests", "groot")
#: The most the smoke run may take with every step at its cap: a GPU session is about 15 minutes, start-up included.
WORST_CASE_S = 360
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")  # fmt: skip


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHON"] = sys.executable
    return env


def test_smoke_script_runs_every_step_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_smoke.sh"), "--cpu", str(out)], cwd=ROOT,
                          env=environment(), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p for p in out.rglob("*"))
    assert len(files) <= 8 and all(p.is_file() and p.parent == out for p in files), files
    assert all(SAFE_NAME.fullmatch(p.name) for p in files), files
    assert {p.name for p in files} == {"summary.txt", "env.txt", "log.txt", "tests.txt", "results.jsonl"}
    summary = (out / "summary.txt").read_text()
    worst = re.match(r"worst case: (\d+) s \((.*)\)\n", summary)
    assert worst and int(worst[1]) <= WORST_CASE_S, summary[:300]
    caps = [int(term.split()[-1]) for term in worst[2].split(" + ") if not term.endswith(" kill graces of 5")]
    graces = int(re.search(r"(\d+) kill graces of (\d+)", worst[2])[1]) * 5
    assert sum(caps) + graces == int(worst[1]), worst[0]  # the printed total is the sum of its terms
    step_lines = [line for line in summary.splitlines() if not line.startswith(" ")]
    for step in STEPS:
        (line,) = [line for line in step_lines if line.startswith(f"{step}: ")]
        assert step == "env" or line.startswith(f"{step}: ok in "), line
    assert re.search(r"^    pi0-tiny cudagraph reference v2 b1: p50 [0-9.]+ ms", summary, re.MULTILINE), summary
    assert "skipped" in (out / "tests.txt").read_text()  # the GPU tests: selected, each skipped with its reason
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 4  # pi0 and groot: eager and CUDA graph each
    for record in records:
        assert set(RESULT_KEYS) <= set(record) and SAFE_NAME.fullmatch(record["file"])
        if record["capture"] == "cudagraph":  # the replay stand-in computes exactly what eager does
            assert record["max_abs_diff_vs_eager"] == 0.0 and record["graphs_captured"] >= 1
    assert {r["preset"] for r in records} == {"pi0-tiny", "groot-tiny"}


def test_a_step_stopped_at_its_limit_reports_and_keeps_its_output(tmp_path):
    out = tmp_path / "out"
    script = f"""
        source tools/gpu_common.sh
        gpu_setup {out} 60 1
        gpu_step slow 5 'started' "$PYTHON" -c "import time; print('started', flush=True); time.sleep(60)"
        gpu_step quick 30 'p50' "$PYTHON" -c "print('x p50 1.0 ms')"
    """
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=environment(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("slow: stopped at its limit (5 s) in ") and summary[1] == "    started", summary
    assert summary[2].startswith("quick: ok in ") and summary[3] == "    x p50 1.0 ms", summary
    assert "started" in (out / "log.txt").read_text()


def test_a_record_is_written_when_its_timing_is_done_and_a_failed_profiler_pass_is_null_with_its_reason(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_measure
    finally:
        sys.path.remove(str(ROOT / "tools"))
    from embodied_accel import platform as platform_mod
    from embodied_accel.bench import harness

    plat = platform_mod.detect()
    measured = gpu_measure.measure_call(lambda: None, plat, warmup=0, runs=2)
    record = harness.result_record(model="pi0", preset="pi0-tiny", backend="reference", capture="eager",
                                   dtype="float32", batch=1, views=2, steps=1, times=measured.pop("times"),
                                   aten_ops_per_call=None, plat=plat, **measured)  # fmt: skip
    seen_on_disk = []

    def compare():  # the file holds the timing before any optional step runs
        seen_on_disk.extend(json.loads(p.read_text())["p50_ms"] for p in tmp_path.glob("*.json"))
        return {"max_abs_diff_vs_eager": 0.0}

    def profiler_pass():
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    path = gpu_measure.write_then_complete(record, tmp_path, [("profiler", profiler_pass), ("compare", compare)])
    assert seen_on_disk == [record["p50_ms"]]
    written = json.loads(path.read_text())
    assert written["kernel_launches_per_call"] is None and written["device_busy_fraction"] is None
    assert written["profiler_error"] == "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
    assert written["max_abs_diff_vs_eager"] == 0.0  # the steps after a failed one still run
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # completed in place, no second file


COMPILING = ("torch.compile(", 'capture="compile"', '"--capture", "compile"')


def _is_compile_mark(node) -> bool:
    return ast.unparse(node) == "pytest.mark.compile"


def test_every_test_that_compiles_carries_the_compile_mark():
    """The smoke run's test step leaves out ``-m compile``: a test that compiles without the mark would run cold
    inductor compiles under the per-test timeout. Checked on the source of every test module."""
    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
            and "pytest.mark.compile" in ast.unparse(node.value) for node in tree.body
        )  # fmt: skip
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")) or module_marked:
                continue
            marked = any(_is_compile_mark(d) for d in node.decorator_list)
            body = "".join(ast.unparse(statement) for statement in node.body)
            if any(pattern.replace('"', "'") in body for pattern in COMPILING) and not marked:
                unmarked.append(f"{path.name}::{node.name}")
            for decorator in node.decorator_list:  # a compiling parameter: pytest.param(..., marks=pytest.mark.compile)
                text = ast.unparse(decorator)
                params = [n for n in ast.walk(decorator) if isinstance(n, ast.Call) and ast.unparse(n.func) == "pytest.param"]
                bare = text.count("'compile+cudagraph'") + text.count("'compile'")
                covered = sum(1 for n in params if any(_is_compile_mark(k.value) for k in n.keywords if k.arg == "marks")
                              and any(isinstance(a, ast.Constant) and str(a.value).startswith("compile") for a in n.args))  # fmt: skip
                if "parametrize" in text and bare > covered and not marked:
                    unmarked.append(f"{path.name}::{node.name} (parameter)")
    assert not unmarked, f"tests that compile without @pytest.mark.compile: {unmarked}"


def test_followup_int8_gemm_step_runs_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_followup.sh"), "--cpu", str(out), "int8-gemm"],
                          cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert re.search(r"^int8-gemm: ok in ", summary, re.MULTILINE), summary
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert record["kind"] == "int8_gemm" and SAFE_NAME.fullmatch(record["file"])
    rows = record["rows"]
    models = {r["model"] for r in rows} | {same.split()[0] for r in rows for same in r["same_shape"]}
    assert models == {"pi0-tiny", "pi05-tiny", "groot-tiny"}
    assert {r["batch"] for r in rows} == {1, 8}
    for row in rows:  # _int_mm timed exactly where it takes the shape, the Triton kernel everywhere
        assert row["triton_ms"] > 0 and row["bf16_mm_ms"] > 0
        assert (row["int_mm_ms"] is None) == (row["int_mm_refused"] is not None) == (row["chosen"] == "triton")
