"""Builds the official texture stage's native code for the CPU, without nvcc, and makes it importable.

Hunyuan3D-2's rasterizer (``hy3dgen/texgen/custom_rasterizer``) ships a CPU implementation
(``rasterize_image_cpu``) but its ``setup.py`` builds it as a CUDA extension only, so it cannot be installed
without the CUDA toolkit. Here its two C++ sources are compiled as a plain C++ extension: a header directory that
comes first on the include path stands in for ``ATen/cuda/CUDAContext.h``, ``__host__`` / ``__device__`` are
defined empty, and the GPU entry point is a stub that refuses (only CPU tensors reach it). The vertex inpainting
(``differentiable_renderer/mesh_processor.cpp``, the C++ version the Ascend recipe switches to) is built as it is.

The sources are compiled from the checkout unchanged; the build directory is outside every repository.
Used by ``make_fixtures.py`` and ``compare_cpu.py`` in hy3dgen's environment, never by the library or CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

GPU_STUB = """
#include <torch/extension.h>
#include <vector>
std::vector<torch::Tensor> rasterize_image_gpu(torch::Tensor V, torch::Tensor F, torch::Tensor D,
    int width, int height, float occlusion_truncation, int use_depth_prior) {
    TORCH_CHECK(false, "built without CUDA: only CPU tensors can be rasterized");
    return {};
}
"""


def _write_if_changed(path: Path, text: str) -> None:
    """Rewritten only when different: a new modification time would make ninja rebuild everything."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def build_native(hunyuan_src: Path, build_dir: Path, verbose: bool = False):
    """Compile (once; later calls reuse the build) and import ``custom_rasterizer_kernel`` and ``mesh_processor``
    from the Hunyuan3D-2 checkout ``hunyuan_src``; put ``hy3dgen`` and ``custom_rasterizer`` on ``sys.path``.
    Returns ``(custom_rasterizer_kernel, mesh_processor)``."""
    from torch.utils.cpp_extension import load

    texgen = Path(hunyuan_src) / "hy3dgen" / "texgen"
    kernel_dir = texgen / "custom_rasterizer" / "lib" / "custom_rasterizer_kernel"
    if not kernel_dir.is_dir():
        raise SystemExit(f"{hunyuan_src}: not a Hunyuan3D-2 checkout (no {kernel_dir})")
    build_dir = Path(build_dir)
    shim = build_dir / "cuda_shim"
    (shim / "ATen" / "cuda").mkdir(parents=True, exist_ok=True)
    _write_if_changed(shim / "ATen" / "cuda" / "CUDAContext.h", "// CPU-only build: no CUDA context\n")
    stub = build_dir / "rasterizer_gpu_stub.cpp"
    _write_if_changed(stub, GPU_STUB)
    flags = ["-O3", "-D__host__=", "-D__device__="]
    raster_build = build_dir / "custom_rasterizer_kernel"
    raster_build.mkdir(parents=True, exist_ok=True)
    rasterizer = load(
        name="custom_rasterizer_kernel",
        sources=[str(kernel_dir / "rasterizer.cpp"), str(kernel_dir / "grid_neighbor.cpp"), str(stub)],
        extra_include_paths=[str(shim)], extra_cflags=flags, build_directory=str(raster_build), verbose=verbose,
    )  # fmt: skip
    sys.modules["custom_rasterizer_kernel"] = rasterizer
    inpaint_build = build_dir / "mesh_processor"
    inpaint_build.mkdir(parents=True, exist_ok=True)
    mesh_processor = load(
        name="mesh_processor", sources=[str(texgen / "differentiable_renderer" / "mesh_processor.cpp")],
        extra_cflags=["-O3"], build_directory=str(inpaint_build), verbose=verbose,
    )  # fmt: skip
    for path in (Path(hunyuan_src), texgen / "custom_rasterizer"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    return rasterizer, mesh_processor
