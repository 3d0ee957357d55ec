"""The profiler's own status lines (libkineto's ``USDT: ... profiler_start``) stay off the user's stderr; everything
else written to stderr while profiling still reaches it."""

import os
import subprocess
import sys
import textwrap

from embodied_accel.bench.harness import KINETO_STATUS_LINE

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    from embodied_accel.bench import harness, profiler

    def call():
        print("python line inside the call", file=sys.stderr)
        os.write(2, b"fd line inside the call\\n")
        return torch.ones(4) * 2

    print("ops", harness.count_profiled_aten_ops(call))
    summary = profiler.profile_calls(call, calls=1, warmup=0)
    print("profiled", summary.calls)
    print("after", file=sys.stderr)
    """
)


def test_kineto_status_lines_are_dropped_and_the_rest_kept():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("KINETO_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "ops " in done.stdout and "profiled 1" in done.stdout
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines.count("python line inside the call") == 2 and lines.count("fd line inside the call") == 2
    assert lines[-1] == "after"


def test_the_pattern_is_libkinetos_format():
    line = b"USDT:2026-11-23 00:29:21 9569:9569 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    assert KINETO_STATUS_LINE.match(line)
    assert KINETO_STATUS_LINE.match(line.replace(b"USDT", b"STAGE"))
    assert not KINETO_STATUS_LINE.match(b"USDT is an acronym\n")
    assert not KINETO_STATUS_LINE.match(b"ERROR:2026-11-23 00:29:21 1:1 CuptiActivityApi.cpp:1] denied\n")
