"""embodied-accel profile: the summary's numbers are consistent and the files are written."""

import json

import pytest
import torch

from embodied_accel.bench.profiler import HOST_BOUND_BELOW, categorize, profile_calls
from embodied_accel.cli import main


@pytest.mark.parametrize(
    "name,category",
    [
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("ampere_sgemm_128x64_tn", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::linalg_vector_norm", "norm"),
        ("embodied_accel::rms_norm", "norm"),
        ("aten::gelu", "activation"),
        ("aten::roll", "rope"),
        ("aten::copy_", "copy/layout"),
        ("aten::addcmul", "elementwise"),
        ("aten::cumsum", "other"),
    ],
)
def test_categorize(name, category):
    assert categorize(name) == category


def test_profile_of_a_host_bound_call():
    """200 tiny ops: the counts are exact, the fractions add up, and the verdict follows the threshold."""
    x = torch.randn(4)

    def many_small_ops():
        y = x
        for _ in range(200):
            y = y + 1.0
        return y

    summary = profile_calls(many_small_ops, calls=2, warmup=1)
    assert summary.calls == 2
    assert summary.launches_per_call == 200
    assert 0.0 <= summary.device_busy_fraction <= 1.0
    assert summary.device_busy_fraction + summary.device_idle_fraction == pytest.approx(1.0)
    assert max(summary.time_by_type_ms, key=summary.time_by_type_ms.get) == "elementwise"
    adds = [k for k in summary.top_kernels if k[0] == "aten::add"]
    assert adds and adds[0][2] == 200
    expected = "host-bound" if summary.device_busy_fraction < HOST_BOUND_BELOW else "device-bound"
    assert summary.verdict.startswith(expected)


def test_profile_command_writes_trace_summary_and_chart(tmp_path, capsys):
    code = main(["profile", "--no-progress", "--calls", "1", "--warmup", "1", "--num-steps", "2", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "device busy:" in out and "verdict:" in out and "top kernels" in out
    run_dir = tmp_path / "pi0-tiny_reference_eager_float32_b1_v2"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["launches_per_call"] > 100 and summary["time_by_type_ms"]["matmul"] > 0
    assert json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    chart = run_dir / "breakdown.png"
    pytest.importorskip("matplotlib")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
