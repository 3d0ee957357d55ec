"""The cuda backend's Triton kernels compile for real GPUs (H100/H200 = sm_90), checked without a GPU.

``tools/check_triton_compile.py`` compiles every kernel launch of full-width pi0, pi0.5 and GR00T calls to a cubin;
these tests run it in a subprocess (it replaces Triton's driver, and must not see ``TRITON_INTERPRET=1``).
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (pip install triton)")

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "check_triton_compile.py"


def run_python(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")  # a cold compile, as on a fresh machine
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.parametrize(
    "arch,dtypes",
    [
        (90, ["bfloat16", "float32"]),  # H100 / H200
        (89, ["bfloat16"]),  # RTX 4090: 99 KiB of shared memory per block, where 3-stage attention tiles do not fit
    ],
)
def test_every_kernel_compiles_at_model_shapes(tmp_path, arch, dtypes):
    dtype_args = [arg for dtype in dtypes for arg in ("--dtype", dtype)]
    done = run_python([str(TOOL), "--arch", str(arch), "--batch", "1", *dtype_args, "--out", str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (result_file,) = tmp_path.glob("*_triton_compile_*.json")
    result = json.loads(result_file.read_text())
    assert result["failures"] == [] and result["never_launched"] == []
    variants = result["variants"]
    launched = {v["kernel"] for v in variants}
    assert {
        "_rms_norm_kernel", "_geglu_kernel", "_rope_kernel", "_rope_store_kv_kernel", "_mqa_attention_kernel",
        "_combine_key_splits_kernel", "_swiglu_kernel", "_qk_rms_norm_rope_kernel", "_ada_layer_norm_kernel",
        "_int8_gemm_kernel", "_quantize_rows_kernel",
    } <= launched  # fmt: skip
    # at depth 2 the prefix pass's attention runs (queries = keys under the prefix-LM mask, pi0's head dim 256; at
    # batch 1 split over keys, its unsplit variant launched by the tool), and GR00T's Qwen3 attention (16 query /
    # 8 K/V heads of 128) through the model itself
    assert result["depth"] >= 2
    attention = [v["constants"] for v in variants if v["kernel"] == "_mqa_attention_kernel" and "*bf16" in v["signature"]]
    assert any("SPLIT=False" in c and "HEAD_DIM=256" in c for c in attention), attention
    assert any("SPLIT=True" in c and "HEAD_DIM=256" in c for c in attention), attention
    assert any("HEAD_DIM=128" in c for c in attention), attention
    # the int8 GEMM at every tile configuration of its plan (int8_gemm.TILE_PLAN's BLOCK_M values; not imported
    # here, where TRITON_INTERPRET is not settled yet; the tool runs it at row counts that reach each one)
    int8_tiles = {c.split("BLOCK_M=")[1].split(",")[0] for c in (v["constants"] for v in variants)
                  if "BLOCK_M=" in c and "RAW=" in c}  # fmt: skip
    assert int8_tiles == {"16", "32", "64", "128"}, int8_tiles
    for v in variants:
        assert v["arch"] == arch and v["cubin_bytes"] > 0 and v["problems"] == [], v
        assert v["registers"] is not None and 0 < v["registers"] <= 255, v
    built = {("*bf16" in v["signature"], "*fp32" in v["signature"]) for v in variants if v["kernel"] == "_geglu_kernel"}
    assert built == {("bfloat16" in dtypes, False)} | ({(False, True)} if "float32" in dtypes else set())


def test_a_compile_error_the_interpreter_accepts_is_reported(tmp_path):
    """A loop-carried accumulator that changes dtype runs under the interpreter but cannot compile."""
    kernel = textwrap.dedent(
        """
        import triton
        import triton.language as tl

        @triton.jit
        def doubling_kernel(x_ptr, n, BLOCK: tl.constexpr):
            cols = tl.arange(0, BLOCK)
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            for _ in range(0, n):
                acc = acc + tl.load(x_ptr + cols)
                acc = acc.to(tl.bfloat16)  # the bug: fp32 in, bf16 out of the loop body
            tl.store(x_ptr + cols, acc)
        """
    )
    (tmp_path / "buggy.py").write_text(kernel)
    interpreted = textwrap.dedent(
        f"""
        import os, sys
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, {str(tmp_path)!r})
        import torch
        from buggy import doubling_kernel
        doubling_kernel[(1,)](torch.ones(4, dtype=torch.bfloat16), 3, BLOCK=4)
        print("interpreter ran it")
        """
    )
    compiled = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(TOOL.parent)!r}]
        import check_triton_compile as check
        import torch
        from triton.backends.compiler import GPUTarget
        from buggy import doubling_kernel
        check.driver.set_active(check.CompileOnlyDriver(GPUTarget("cuda", 90, 32)))
        with check.LaunchCompiler() as compiler:
            compiler.arch = 90
            doubling_kernel[(1,)](torch.ones(4, dtype=torch.bfloat16), 3, BLOCK=4)
        print("FAILURES", compiler.failures)
        """
    )
    (tmp_path / "interpreted.py").write_text(interpreted)
    (tmp_path / "compiled.py").write_text(compiled)
    ran = subprocess.run([sys.executable, str(tmp_path / "interpreted.py")], capture_output=True, text=True, timeout=300)
    assert "interpreter ran it" in ran.stdout, ran.stderr[-2000:]
    done = run_python([str(tmp_path / "compiled.py")], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "doubling_kernel for sm_90" in done.stdout and "Loop-carried variable acc" in done.stdout, done.stdout
