"""embodied-accel profile: the summary's numbers are consistent and the files are written."""

import json

import pytest
import torch

from embodied_accel.bench.profiler import COMPUTE_BOUND_ABOVE, categorize, profile_calls
from embodied_accel.cli import main

#: Bookkeeping in float64 on a handful of values (statistics, fractions, schedules): a few roundings near 1e-16
#: each, so 1e-12 relative leaves room for any order of them and none for a wrong formula.
FLOAT64_ARITHMETIC = 1e-12


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


def test_profile_of_an_overhead_bound_call():
    """200 tiny ops: the counts are exact, the fractions add up, and on a CPU the verdict is overhead-bound (the
    host is busy in ATen most of the call, but with no arithmetic to speak of)."""
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
    assert summary.device_busy_fraction + summary.device_idle_fraction == pytest.approx(1.0, rel=FLOAT64_ARITHMETIC)
    # the 200 adds are timed as elementwise work (which category takes longest is left to the scheduler: on a
    # loaded machine one stray op outside them can outlast the lot)
    assert summary.time_by_type_ms["elementwise"] > 0
    adds = [k for k in summary.top_kernels if k[0] == "aten::add"]
    assert adds and adds[0][2] == 200
    assert summary.compute_fraction == 0.0
    assert summary.verdict.startswith("overhead-bound"), summary.verdict


def test_a_cpu_call_of_large_matmuls_is_compute_bound():
    """Two 384x384 GEMMs: the call is arithmetic (about 57 MFLOP), not op overhead."""
    a = torch.randn(384, 384)
    summary = profile_calls(lambda: a @ a @ a, calls=2, warmup=1)
    assert summary.compute_fraction > COMPUTE_BOUND_ABOVE
    assert summary.verdict.startswith("compute-bound"), summary.verdict


def test_profile_command_writes_trace_summary_and_chart(tmp_path, capsys):
    code = main(["profile", "--no-progress", "--calls", "1", "--warmup", "1", "--num-steps", "2", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "in ATen ops:" in out and "verdict:" in out and "top kernels" in out
    run_dir = tmp_path / "pi0-tiny_reference_eager_float32_b1_v2"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["launches_per_call"] > 100 and summary["time_by_type_ms"]["matmul"] > 0
    assert json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    chart = run_dir / "breakdown.png"
    pytest.importorskip("matplotlib")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _event(name, device, start_us, end_us):
    """The fields of a profiler FunctionEvent that the CUDA summary reads."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    device_type = DeviceType.CUDA if device == "gpu" else DeviceType.CPU
    return SimpleNamespace(name=name, device_type=device_type, time_range=SimpleNamespace(start=start_us, end=end_us))


def _gpu_trace(kernel_spans, marker="embodied_accel.profile.call", window=(0, 1000)):
    """One call's window on the host, its annotation's GPU-side image, a memcpy, and the given kernels."""
    events = [
        _event(marker, "cpu", *window),
        _event(marker, "gpu", *window),  # the annotation mirrored on the GPU timeline: not a kernel
        _event("Memcpy HtoD (Pageable -> Device)", "gpu", 0, 50),
        _event("aten::mm", "cpu", 10, 900),  # host-side ops do not count as device work on CUDA
    ]
    events += [_event(name, "gpu", start, end) for name, start, end in kernel_spans]
    return events


@pytest.mark.parametrize(
    "spans,busy,verdict",
    [
        # 5 short kernels separated by host gaps: 100 µs of 1000 busy
        ([("_rms_norm_kernel", 100 * i, 100 * i + 20) for i in range(5)], 0.10, "host-bound"),
        # a captured call: back-to-back kernels, overlapping ones counted once (union), 950 µs of 1000
        ([("sm90_xmma_gemm_bf16", 0, 500), ("_geglu_kernel", 450, 700), ("fmha_cutlassF", 700, 950)], 0.95, "device-bound"),
    ],
)
def test_cuda_summary_from_a_synthetic_trace(spans, busy, verdict):
    """The CUDA branch (never run here on a GPU): kernels only, busy = union of kernel intervals over the call."""
    from embodied_accel.bench.profiler import summarize
    from embodied_accel.platform import Platform

    plat = Platform("cuda", "synthetic H100", has_triton=True, has_torch_npu=False)
    summary = summarize(_gpu_trace(spans), "embodied_accel.profile.call", 1, plat)
    assert summary.launch_kind == "kernel launches" and summary.launches_per_call == len(spans)
    assert summary.wall_ms_per_call == pytest.approx(1.0, rel=FLOAT64_ARITHMETIC)
    assert summary.device_busy_fraction == pytest.approx(busy, rel=FLOAT64_ARITHMETIC)
    assert summary.verdict.startswith(verdict)
    assert {name for name, _, _ in summary.top_kernels} == {name for name, _, _ in spans}
    assert sum(summary.time_by_type_ms.values()) == pytest.approx(sum(e - s for _, s, e in spans) / 1e3, rel=FLOAT64_ARITHMETIC)
