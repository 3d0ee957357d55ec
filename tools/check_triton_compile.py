"""Compile every Triton kernel of the cuda backend for real GPUs, on a machine that has none.

The interpreter (``TRITON_INTERPRET=1``) checks what the kernels compute, not that they compile: it runs the
kernel body as NumPy and accepts code the real compiler rejects, and it never allocates registers or shared
memory. This tool closes that gap without a GPU. It installs a compile-only Triton driver (a fixed GPU
target, no device) and turns every kernel launch into a compilation: the launch's own arguments go through
Triton's own specialization (dtypes, 16-byte alignment, divisibility by 16, integers equal to 1), so each
compiled variant is the one a real launch with these tensors would build. Then ``ptxas`` assembles it into a
cubin for the architecture, and the tool checks what would otherwise only fail on the device:

* the cubin builds (Triton → TTIR → TTGIR → LLVM → PTX → ``ptxas``);
* its shared memory fits the architecture (Triton checks that only when a kernel is loaded);
* ``ptxas -v``: registers per thread and bytes spilled to local memory (reported; spills are flagged).

The launches come from real calls of the models at full width on the CPU through the cuda backend, with each of
its attention kernels (packed SDPA, Triton), at batch 1 and 8, in bf16 and fp32:

* pi0 and pi0.5 (SigLIP-So400m, Gemma-2B and Gemma-300M layers, a small vocabulary), 2 views and the real prompt
  bucket, at depth 2: at depth 1 the VLM's only layer is its last, which over the prefix just writes K/V, so the
  prefix pass's attention (prefix-LM mask, queries = keys, no key split) would never be launched;
* GR00T N1.6 (SigLIP2, Qwen3 with 16 query / 8 K/V heads, the AlternateVLDiT, the released widths; SigLIP2 at
  depth 1, Qwen3 and the DiT at depth 2, a small vocabulary) over a 252x252 frame and the 128-token prompt bucket;
* the ops no model above calls at these shapes: RoPE without a cache write, pi0.5's adaRMS norms with one
  conditioning per batch row (training's), the W8A8 int8 GEMM at VGGT's aggregator MLP shapes.

Kernel outputs are never written (nothing runs), so the numbers the models compute are meaningless; only the
launches matter. So the models' GEMMs (every one goes through the op set's ``linear`` / ``linear_into``) only
allocate their outputs, as the real ones do: the models have no branch on tensor values, so every launch sees the
shapes, dtypes and strides of a real call, at a fraction of the CPU time.

    python tools/check_triton_compile.py [--arch 90 --arch 89 --arch 80] [--out bench/results]

Exit status 1 when a kernel fails to compile or does not fit. Run it with the Triton version of the GPU
machine too (``pip install triton==3.6.0`` in a virtual environment) — compilers differ between releases.
Must not run with ``TRITON_INTERPRET=1`` (it is cleared before Triton is imported).
"""

from __future__ import annotations

import os

os.environ.pop("TRITON_INTERPRET", None)  # the real compiler, before any @triton.jit runs

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Shared memory a block may use, by compute capability (bytes; CUDA programming guide, opt-in maximum).
MAX_SHARED_BYTES = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
GPU_NAMES = {80: "A100", 86: "RTX 30xx / A10", 89: "RTX 4090 / L40", 90: "H100 / H200"}


class CompileOnlyDriver:
    """Just enough of a Triton driver to compile for ``target``: device 0, stream 0, nothing can launch."""

    def __init__(self, target: GPUTarget):
        self.target = target

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def __getattr__(self, name):
        raise AttributeError(f"the compile-only driver cannot {name!r}: nothing runs on a device here")


@dataclasses.dataclass
class CompiledVariant:
    kernel: str
    arch: int
    signature: str
    constants: str
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int | None = None
    spill_bytes: int | None = None
    cubin_bytes: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)  # it would not load or run on the device
    warnings: list[str] = dataclasses.field(default_factory=list)  # it runs, slower than it should


class LaunchCompiler:
    """While active, every ``kernel[grid](...)`` compiles for the current target and launches nothing."""

    def __init__(self):
        self.variants: dict[tuple, CompiledVariant] = {}
        self.failures: list[str] = []
        self._run = JITFunction.run
        self.arch = 0

    def __enter__(self):
        compiler = self

        def compile_only_run(jit_fn, *args, grid, warmup, **kwargs):
            try:
                kernel = compiler._run(jit_fn, *args, grid=grid, warmup=True, **kwargs)
            except Exception as exc:  # noqa: BLE001 — a compile error is the finding; keep collecting
                message = f"{jit_fn.fn.__name__} for sm_{compiler.arch}: {type(exc).__name__}: {exc}"
                if message not in compiler.failures:
                    compiler.failures.append(message)
                return None
            compiler._record(jit_fn, kernel)
            return kernel

        JITFunction.run = compile_only_run
        return self

    def __exit__(self, *exc):
        JITFunction.run = self._run

    def _record(self, jit_fn, kernel) -> None:
        meta = kernel.metadata
        key = (self.arch, meta.hash)
        if key in self.variants:
            return
        src = kernel.src
        signature = ", ".join(f"{k}: {v}" for k, v in src.signature.items() if v != "constexpr")
        names = [param.name for param in jit_fn.params]
        constants = ", ".join(
            f"{names[k[0]] if isinstance(k, tuple) and len(k) == 1 else k}={v}"
            for k, v in sorted(src.constants.items(), key=str)
        )
        variant = CompiledVariant(
            kernel=jit_fn.fn.__name__, arch=self.arch, signature=signature, constants=constants,
            num_warps=meta.num_warps, num_stages=meta.num_stages, shared_bytes=meta.shared,
            cubin_bytes=len(kernel.asm["cubin"]),
        )  # fmt: skip
        variant.registers, variant.spill_bytes = ptxas_usage(kernel.asm["ptx"], self.arch)
        if meta.shared > MAX_SHARED_BYTES[self.arch]:
            variant.problems.append(f"needs {meta.shared} B shared memory; sm_{self.arch} has {MAX_SHARED_BYTES[self.arch]}")
        if meta.num_warps * 32 > 1024:
            variant.problems.append(f"{meta.num_warps} warps exceed 1024 threads per block")
        if variant.spill_bytes:
            variant.warnings.append(f"spills {variant.spill_bytes} B to local memory")
        self.variants[key] = variant


def ptxas_usage(ptx: str, arch: int) -> tuple[int | None, int | None]:
    """Registers per thread and spill-store bytes that ``ptxas -v`` reports for this PTX (None if unknown)."""
    from triton.backends.nvidia import compiler as nvidia_compiler

    ptxas = nvidia_compiler.get_ptxas(arch).path
    target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        done = subprocess.run(
            [ptxas, f"-arch={target}", "-v", str(path), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True, text=True,
        )  # fmt: skip
    report = done.stdout + done.stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return (int(registers.group(1)) if registers else None, int(spills.group(1)) if spills else None)


def assume_device(arch: int) -> None:
    """Launch decisions that read the device (tile stages that must fit its shared memory) follow ``arch``."""
    from embodied_accel.ops.cuda import attention

    attention.INTERPRETER_SHARED_BYTES = MAX_SHARED_BYTES[arch]


def jit_kernels() -> list[JITFunction]:
    """Every ``@triton.jit`` function of the cuda backend's kernel modules."""
    import importlib
    import pkgutil

    from embodied_accel.ops import cuda as cuda_pkg

    found = []
    for info in pkgutil.iter_modules(cuda_pkg.__path__):
        module = importlib.import_module(f"{cuda_pkg.__name__}.{info.name}")
        found += [obj for obj in vars(module).values() if isinstance(obj, JITFunction) and obj not in found]
    return found


#: Layers per tower of the full-width models: 2, so that every pass has a layer whose attention output is read.
DEPTH = 2


def compile_only_ops(attention: str):
    """The cuda backend for a compile-only GPU with GEMMs that allocate their outputs (contiguous ``[rows, out]``
    in the input's dtype, as ``torch.mm`` / ``torch.addmm`` return) and compute nothing."""
    import dataclasses

    from embodied_accel.ops import get_ops
    from embodied_accel.platform import Platform

    ops = get_ops("cuda", Platform("cuda", "compile-only", True, False), cuda_attention=attention)

    def linear(x, weight_t, bias=None, residual=None):
        return x.new_empty(x.shape[0], weight_t.shape[1])

    def linear_into(x, weight_t, bias, out):
        return out

    return dataclasses.replace(ops, linear=linear, linear_into=linear_into)


def model_launches(dtype: torch.dtype, batch: int, views: int = 2, tokens: int = 48) -> None:
    """One call of pi0 and of pi0.5 at full width (:data:`DEPTH` layers in the VLM and the expert, 1 in SigLIP)
    through the cuda backend, on the CPU, with each of the backend's attention kernels."""
    from embodied_accel.models.pi0.config import get_preset
    from embodied_accel.models.pi0.model import Pi0Model
    from embodied_accel.models.pi0.weights import init_random_weights
    from embodied_accel.ops import CUDA_ATTENTION_KERNELS

    for preset, attention in itertools.product(("pi0", "pi05"), CUDA_ATTENTION_KERNELS):
        ops = compile_only_ops(attention)
        cfg = get_preset(preset)
        cfg = dataclasses.replace(
            cfg, vocab_size=1024,
            vision=dataclasses.replace(cfg.vision, depth=1),
            vlm=dataclasses.replace(cfg.vlm, depth=DEPTH),
            expert=dataclasses.replace(cfg.expert, depth=DEPTH),
        )  # fmt: skip
        with torch.device("meta"):
            model = Pi0Model(cfg, ops, compute_dtype=dtype)
        init_random_weights(model, 0, "cpu")
        model.eval()
        args = (
            torch.rand(batch, views, 3, 224, 224) * 2 - 1, torch.ones(batch, views, dtype=torch.bool),
            torch.randint(0, cfg.vocab_size, (batch, tokens)), torch.ones(batch, tokens, dtype=torch.bool),
            torch.randn(batch, cfg.max_state_dim), torch.randn(batch, cfg.action_horizon, cfg.max_action_dim),
        )  # fmt: skip
        with torch.no_grad():
            model.sample_actions(*args, num_steps=2)


def groot_model_launches(dtype: torch.dtype, batch: int) -> None:
    """One call of GR00T N1.6 at full width (SigLIP2 at depth 1, Qwen3 and the DiT at :data:`DEPTH`, a small
    vocabulary) through the cuda backend with each attention kernel: one 252x252 view, the 128-token prompt bucket,
    2 denoising steps."""
    from types import SimpleNamespace

    from groot_gpu_bench import synthetic_inputs

    from embodied_accel.models.groot.config import get_preset
    from embodied_accel.models.groot.model import GrootModel, build_buffers
    from embodied_accel.models.groot.weights import init_random_weights
    from embodied_accel.ops import CUDA_ATTENTION_KERNELS

    full = get_preset("groot-n1.6")
    cfg = dataclasses.replace(
        full, vocab_size=1024, image_token_id=1000, num_steps=2,
        vision=dataclasses.replace(full.vision, depth=1),
        llm=dataclasses.replace(full.llm, depth=DEPTH),
        dit=dataclasses.replace(full.dit, depth=DEPTH),
    )  # fmt: skip
    for attention in CUDA_ATTENTION_KERNELS:
        with torch.device("meta"):
            model = GrootModel(cfg, compile_only_ops(attention), compute_dtype=dtype)
        init_random_weights(model, 0, "cpu")
        model.eval()
        inputs = synthetic_inputs(SimpleNamespace(config=cfg, token_bucket=32), batch, views=1, side=252)
        noise = torch.randn(batch, cfg.action_horizon, cfg.max_action_dim)
        buffers = build_buffers(model, inputs.bucket, "cpu")
        with torch.no_grad():
            model.sample_actions(inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, inputs.state,
                                 noise, buffers)  # fmt: skip


def op_launches(dtype: torch.dtype, batch: int, seq: int = 51, arch: int = 90) -> None:
    """Ops of the cuda backend that pi0 and pi0.5 do not call themselves, at their models' shapes.

    ``rope`` (rotate Q and K of a merged ``[B, 8 + 2, S, 256]`` projection, no cache write) is served for
    callers without a static cache; the adaRMS norms with per-row modulation for a training step's conditioning;
    the W8A8 / FP8 row quantization (FP8 from sm_89 on, the first with float8 conversions); the attention
    kernel's unsplit variant at a prefix pass's shape.
    """
    from embodied_accel.ops.cuda import norms, rope

    qkv = torch.randn(batch, seq, 10, 256, dtype=dtype).transpose(1, 2)
    cos, sin = torch.randn(batch, seq, 256, dtype=dtype), torch.randn(batch, seq, 256, dtype=dtype)
    rope.rope(qkv, cos, sin, 9)
    # pi0.5's expert norms with one conditioning per batch row (what a training step passes): the per-row variant
    x = torch.randn(batch, seq, 1024, dtype=dtype)
    per_row = [torch.randn(batch, 1, 1024) for _ in range(2)]
    norms.ada_rms_norm(x, *per_row, 1e-6)
    norms.gated_add_ada_rms_norm(x, x, torch.randn(batch, 1, 1024, dtype=dtype), *per_row, 1e-6)
    # W8A8 (VGGT's plan): the aggregator MLPs at full width, ``batch`` frames of 1041 tokens (518x392 crops)
    from embodied_accel.ops.cuda import int8_gemm

    # on the Triton kernel itself (cuBLAS's _int_mm takes these shapes on a GPU), and at row counts that reach every
    # tile configuration of its plan (1 / 50 / 200 / 1041 tokens per batch row)
    for tokens in (batch, batch * 50, batch * 200, batch * 1041):
        for fan_in, fan_out in ((1024, 4096), (4096, 1024)):
            x_q = torch.randint(-127, 128, (tokens, fan_in), dtype=torch.int8)
            w_q = torch.randint(-127, 128, (fan_out, fan_in), dtype=torch.int8).t()
            int8_gemm.triton_linear(x_q, torch.rand(tokens), w_q, torch.rand(fan_out),
                                    torch.randn(fan_out, dtype=dtype), dtype)  # fmt: skip
    # the attention kernel without key splits at pi0's prefix shape (816 tokens, 8 query heads of 256 over one K/V
    # head): at batch 1 the automatic plan splits every pi0 / GR00T pass (their row blocks leave SMs idle)
    from embodied_accel.ops.cuda import attention

    prefix = 816
    q = torch.randn(batch, prefix, 8, 256, dtype=dtype).transpose(1, 2)
    kv = torch.randn(batch, 1, prefix, 256, dtype=dtype)
    unsplit = attention.AttentionLaunch(block_m=0, block_n=0, num_warps=0, num_stages=0, key_splits=1)
    attention.mqa_attention(q, kv, kv, torch.ones(batch, prefix, prefix, dtype=torch.bool), 256**-0.5, unsplit)
    from embodied_accel.ops.cuda import row_quant

    for width in (1024, 4096):  # the aggregator MLP's inputs (int8); pi0's expert widths (FP8)
        row_quant.quantize_rows_int8(torch.randn(tokens, width, dtype=dtype))
        if arch >= 89:
            row_quant.quantize_rows_fp8(torch.randn(batch * seq, width, dtype=dtype))


def groot_launches(dtype: torch.dtype, batch: int, prompt: int = 128, tokens: int = 51) -> None:
    """GR00T N1.6's ops of the cuda backend at the released shapes: Qwen3's q/k-norm + RoPE on the merged
    ``[B, 16 + 2 * 8, S, 128]`` projection and its SwiGLU (MLP 6144) over a 128-token prompt bucket; the DiT's
    AdaLN (1536 wide, shared modulation, and parameter-free) over 1 state + 50 action tokens."""
    from embodied_accel.ops.cuda import activations, norms, rope

    qkv = torch.randn(batch, prompt, 32, 128, dtype=dtype).transpose(1, 2)
    cos, sin = torch.randn(batch, prompt, 128, dtype=dtype), torch.randn(batch, prompt, 128, dtype=dtype)
    rope.qk_rms_norm_rope(qkv, torch.randn(24, 128, dtype=dtype), 1e-6, cos, sin)
    activations.swiglu(torch.randn(batch * prompt, 2 * 6144, dtype=dtype))
    x = torch.randn(batch * tokens, 1536, dtype=dtype)
    norms.ada_layer_norm(x, torch.randn(1536, dtype=dtype), torch.randn(1536, dtype=dtype), 1e-5)
    norms.ada_layer_norm(x, None, None, 1e-6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, action="append", choices=sorted(MAX_SHARED_BYTES),
                        help="compute capability ×10 to compile for (repeatable; default 90)")  # fmt: skip
    parser.add_argument("--batch", type=int, action="append", help="batch sizes to run (default 1 and 8)")
    parser.add_argument("--dtype", action="append", choices=("bfloat16", "float32"), help="default both")
    parser.add_argument("--out", default=None, help="write a JSON result file into this folder")
    args = parser.parse_args(argv)
    archs, batches = args.arch or [90], args.batch or [1, 8]
    dtypes = [getattr(torch, name) for name in (args.dtype or ["bfloat16", "float32"])]
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    kernels = jit_kernels()
    compiler = LaunchCompiler()
    started = time.perf_counter()
    with compiler:
        for arch in archs:
            compiler.arch = arch
            driver.set_active(CompileOnlyDriver(GPUTarget("cuda", arch, 32)))
            for kernel in kernels:
                kernel.device_caches.clear()  # the binder holds the target it was built for
            assume_device(arch)
            for dtype in dtypes:
                for batch in batches:
                    model_launches(dtype, batch)
                    groot_model_launches(dtype, batch)
                    op_launches(dtype, batch, arch=arch)
                    groot_launches(dtype, batch)
    seconds = time.perf_counter() - started

    variants = sorted(compiler.variants.values(), key=lambda v: (v.arch, v.kernel, v.signature, v.constants))
    never_launched = sorted({k.fn.__name__ for k in kernels} - {v.kernel for v in variants} - helper_names(kernels))
    print(f"Triton {triton.__version__}, torch {torch.__version__}: {len(variants)} kernel variants in {seconds:.0f} s")
    for v in variants:
        regs = "?" if v.registers is None else v.registers
        flag = "  <-- " + "; ".join(v.problems + v.warnings) if v.problems or v.warnings else ""
        print(f"sm_{v.arch} {v.kernel:28s} warps {v.num_warps} shared {v.shared_bytes:6d} B  regs {regs:>3}  "
              f"spill {v.spill_bytes or 0} B  [{v.signature}] {{{v.constants}}}{flag}")  # fmt: skip
    for failure in compiler.failures:
        print(f"FAILED {failure}")
    if never_launched:
        print(f"never launched: {', '.join(never_launched)}")

    if args.out:
        record = dict(
            kind="triton_compile_check", triton=triton.__version__, torch=torch.__version__, archs=archs,
            batches=batches, dtypes=[str(d) for d in dtypes], depth=DEPTH, seconds=round(seconds, 1),
            variants=[dataclasses.asdict(v) for v in variants], failures=compiler.failures,
            never_launched=never_launched,
        )  # fmt: skip
        stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
        path = Path(args.out) / f"{stamp}_triton_compile_triton{triton.__version__}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")
    bad = compiler.failures or [v for v in variants if v.problems] or never_launched
    return 1 if bad else 0


def helper_names(kernels: list[JITFunction]) -> set[str]:
    """``@triton.jit`` helpers called from kernels (inlined, never launched themselves)."""
    return {k.fn.__name__ for k in kernels if not k.fn.__name__.endswith("_kernel")}


if __name__ == "__main__":
    sys.exit(main())
