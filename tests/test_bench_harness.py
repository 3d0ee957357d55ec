"""The model-agnostic benchmark harness: op counting, timing, statistics, environment stamp, result files."""

import json
import math
import re
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
import torch

from embodied_accel.bench import harness
from embodied_accel.platform import Platform

#: Bookkeeping in float64 on a handful of values (statistics, fractions, schedules): a few roundings near 1e-16
#: each, so 1e-12 relative leaves room for any order of them and none for a wrong formula.
FLOAT64_ARITHMETIC = 1e-12

CPU = Platform(device_type="cpu", device_name="Test CPU @ 2.0GHz", has_triton=False, has_torch_npu=False)


def test_count_aten_ops_counts_a_known_sequence_exactly():
    a, b = torch.ones(3), torch.ones(3)

    def fn():
        c = a + b
        c.mul_(2)
        return c

    result, total, counts = harness.count_aten_ops(fn)
    assert total == 2
    assert counts == {"aten.add.Tensor": 1, "aten.mul_.Tensor": 1}
    assert torch.equal(result, torch.full((3,), 4.0))


def test_count_aten_ops_includes_views_and_passes_arguments():
    def fn(x, *, scale):
        return x.view(2, 2).t() * scale  # view, t (a view too), mul

    result, total, counts = harness.count_aten_ops(fn, torch.arange(4.0), scale=3.0)
    assert total == 3
    assert counts["aten.view.default"] == 1 and counts["aten.t.default"] == 1
    assert torch.equal(result, torch.arange(4.0).view(2, 2).t() * 3)


def test_summarize_known_numbers():
    stats = harness.summarize([0.001, 0.002, 0.003, 0.004, 0.005])  # seconds
    assert stats["mean_ms"] == pytest.approx(3.0, rel=FLOAT64_ARITHMETIC)
    assert stats["p50_ms"] == pytest.approx(3.0, rel=FLOAT64_ARITHMETIC)
    assert stats["p90_ms"] == pytest.approx(4.6, rel=FLOAT64_ARITHMETIC)  # linear interpolation between 4 and 5
    assert stats["min_ms"] == pytest.approx(1.0, rel=FLOAT64_ARITHMETIC)
    assert stats["max_ms"] == pytest.approx(5.0, rel=FLOAT64_ARITHMETIC)
    assert stats["std_ms"] == pytest.approx(math.sqrt(2.5), rel=FLOAT64_ARITHMETIC)  # sample standard deviation
    assert harness.summarize([0.01])["std_ms"] == 0.0
    with pytest.raises(ValueError):
        harness.summarize([])


def test_time_calls_runs_warmup_then_timed_calls_with_synchronisation():
    calls, syncs = [], []
    times = harness.time_calls(
        lambda: calls.append(1), warmup=2, runs=5, synchronize=lambda: syncs.append(1), progress=False
    )
    assert len(times) == 5 and len(calls) == 7
    assert all(t >= 0 for t in times)
    assert len(syncs) == 1 + 2 * 5  # once after warm-up, then before and after every timed call
    with pytest.raises(ValueError):
        harness.time_calls(lambda: None, warmup=0, runs=0, synchronize=lambda: None, progress=False)


def test_busy_fraction_merges_overlapping_intervals():
    assert harness.busy_fraction([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(0.4, rel=FLOAT64_ARITHMETIC)
    assert harness.busy_fraction([(-5, 1), (9, 20)], 0, 10) == pytest.approx(0.2, rel=FLOAT64_ARITHMETIC)  # clipped to the window
    assert harness.busy_fraction([], 0, 1) == 0.0


def test_device_activity_is_none_on_cpu():
    assert harness.device_activity(lambda: None, CPU) == (None, None)


def test_environment_stamp_fields():
    stamp = harness.environment_stamp(CPU)
    assert stamp["device"] == "Test CPU @ 2.0GHz" and stamp["device_type"] == "cpu"
    versions = stamp["versions"]
    assert {"python", "torch", "numpy", "embodied_accel"} <= set(versions)
    assert versions["torch"] == torch.__version__
    assert stamp["git_sha"] is None or re.fullmatch(r"[0-9a-f]{40}", stamp["git_sha"])
    assert stamp["git_dirty"] in (None, True, False)
    assert datetime.fromisoformat(stamp["date"]).utcoffset().total_seconds() == 0
    assert stamp["threads"] == torch.get_num_threads()
    assert stamp["cpu_count"] >= 1


def test_git_state_outside_a_repository(tmp_path):
    assert harness.git_state(tmp_path) == (None, None)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_state_reads_sha_and_dirty_tracked_files_only(tmp_path):
    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    sha, dirty = harness.git_state(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", sha) and dirty is False
    (tmp_path / "untracked.json").write_text("{}")
    assert harness.git_state(tmp_path)[1] is False
    (tmp_path / "a.txt").write_text("2")
    assert harness.git_state(tmp_path) == (sha, True)


def _record(**extra):
    return harness.result_record(
        model="pi0",
        preset="pi0-tiny",
        backend="reference",
        capture="eager",
        dtype="float32",
        batch=1,
        views=2,
        steps=10,
        times=[0.010, 0.012, 0.011],
        aten_ops_per_call=923,
        peak_mem_mb=250.0,
        plat=CPU,
        **extra,
    )


def test_write_result_writes_flat_json_with_every_design_key(tmp_path):
    record = _record(warmup=3, note="unit test")
    path = harness.write_result(record, tmp_path / "results")
    assert path.parent == tmp_path / "results"
    assert re.fullmatch(r"\d{8}T\d{6}Z_pi0_pi0-tiny_reference_eager_float32_b1_v2_test-cpu-2.0ghz\.json", path.name), (
        path.name
    )
    data = json.loads(path.read_text())
    assert set(harness.RESULT_KEYS) <= set(data)
    assert data["runs"] == 3 and data["mean_ms"] == pytest.approx(11.0, rel=FLOAT64_ARITHMETIC) and data["p50_ms"] == pytest.approx(11.0, rel=FLOAT64_ARITHMETIC)
    assert data["kernel_launches_per_call"] is None and data["device_busy_fraction"] is None  # CPU
    assert data["device"] == "Test CPU @ 2.0GHz" and data["aten_ops_per_call"] == 923
    assert data["warmup"] == 3 and data["note"] == "unit test"
    assert isinstance(data["versions"], dict)
    assert not [v for v in data.values() if isinstance(v, dict) and v is not data["versions"]]  # flat
    second = harness.write_result(record, tmp_path / "results")
    assert second != path and second.exists() and path.exists()  # never overwritten
    assert not list((tmp_path / "results").glob("*.tmp"))


def test_write_result_rejects_incomplete_or_non_finite_records(tmp_path):
    record = _record()
    del record["p90_ms"]
    with pytest.raises(ValueError, match="p90_ms"):
        harness.write_result(record, tmp_path)
    with pytest.raises(ValueError):
        harness.write_result({**_record(), "mean_ms": float("nan")}, tmp_path)


def test_result_filename_is_safe_for_odd_device_names():
    record = {**_record(), "device": "NVIDIA H100 80GB HBM3 / (MIG 1g.10gb)", "date": "2025-01-02T03:04:05+00:00"}
    name = harness.result_filename(record)
    assert name == "20250102T030405Z_pi0_pi0-tiny_reference_eager_float32_b1_v2_nvidia-h100-80gb-hbm3-mig-1g.10gb.json"
    as_datetime = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC).isoformat()
    assert harness.result_filename({**record, "date": as_datetime}) == name


def test_result_filenames_use_only_letters_digits_dots_dashes_and_underscores():
    record = {**_record(), "capture": "compile+cudagraph", "backend": "cuda+w8a8", "date": "2025-01-02T03:04:05+00:00"}
    name = harness.result_filename(record)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name
    assert "_cuda-w8a8_compile-cudagraph_" in name


def test_result_filename_names_the_quant_mode():
    record = {**_record(), "backend": "cuda", "date": "2025-01-02T03:04:05+00:00"}
    assert "_cuda_eager_" in harness.result_filename({**record, "quant": "none"})
    assert "_cuda-fp8_eager_" in harness.result_filename({**record, "quant": "fp8"})
    assert "_cuda-w8a8_eager_" in harness.result_filename({**record, "quant": "w8a8"})


def test_launches_under_graphs_are_the_hosts_launch_calls():
    """One launch per graph replay plus the kernels launched outside graphs; GPU-side events do not count."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, device=DeviceType.CPU):
        return SimpleNamespace(name=name, device_type=device)

    events = [event("cudaGraphLaunch"), event("cudaLaunchKernel"), event("cuLaunchKernel"), event("aten::copy_"),
              event("cudaMemcpyAsync"), event("void gemm_kernel<...>", DeviceType.CUDA)]  # fmt: skip
    assert harness.host_launches(events) == 3
