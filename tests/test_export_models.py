"""ONNX export of VGGT and Hunyuan3D-2 (tiny presets) checked in ONNX Runtime on the CPU against our eager fp32 model,
bad input to the exporter and the runtime, and the TensorRT build (skipped without TensorRT and a GPU).

Tolerance: 1e-4 absolute, outputs of magnitude ~1-10. VGGT: fp32 roundoff through 10 transformer blocks and the DPT
heads, reductions of <= 128 terms in another order: ~u·sqrt(n)·depth ≈ 1e-5 (measured 8e-6). Hunyuan3D-2: ONNX
Runtime's antialiased resize in the conditioner differs from PyTorch's by ~2e-5 on LayerNorm-scaled tokens, which
three Euler steps of the DiT carry into the latents (measured 1.6e-5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="pip install 'embodied-accel[onnx]'")
pytest.importorskip("onnxscript", reason="pip install 'embodied-accel[onnx]'")

from embodied_accel import cli, deploy  # noqa: E402
from embodied_accel.deploy.manifest import ManifestError  # noqa: E402
from embodied_accel.export import ExportError, export_model  # noqa: E402
from embodied_accel.models.hunyuan3d.model import GeometryKV  # noqa: E402
from embodied_accel.models.vggt.buffers import build_vggt_buffers  # noqa: E402
from embodied_accel.models.vggt.loading import load_vggt_model  # noqa: E402
from embodied_accel.pipelines.shape import ShapeSettings, load_shape_pipeline  # noqa: E402

ATOL = 1e-4


def test_vggt_forward_equals_eager_through_the_command(tmp_path, capsys):
    out = tmp_path / "vggt"
    assert cli.main(["export", "--model", "vggt-tiny", "-o", str(out), "--frames", "2"]) == 0
    assert "forward_frames2.onnx" in capsys.readouterr().out
    model, _ = load_vggt_model("vggt-tiny", backend="reference", device="cpu", progress=False)
    images = torch.rand(1, 2, 3, 56, 56, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(images, build_vggt_buffers(model, 1, 2, (56, 56), "cpu", torch.float32)).as_dict()
    runner = deploy.load(out)
    got = runner(images.numpy())
    assert set(got) == {"pose_enc", "depth", "depth_conf", "world_points", "world_points_conf"}
    for name, value in got.items():
        np.testing.assert_allclose(value, expected[name].numpy(), rtol=0, atol=ATOL, err_msg=name)
    with pytest.raises(ValueError, match="3 frames.*buckets for 2 frames"):
        runner(np.zeros((1, 3, 3, 56, 56), np.float32))


def test_hunyuan3d_sampling_and_decoding_equal_eager(tmp_path):
    manifest = export_model("hunyuan3d-tiny", tmp_path, num_steps=4, chunk=128)
    assert manifest.parts == ("conditioner", "dit_step", "vae_decoder", "vae_query")
    assert manifest.call["loop"]["classifier_free"] and len(manifest.call["loop"]["dts"]) == 3  # the last dt is 0
    pipeline = load_shape_pipeline("hunyuan3d-tiny", backend="reference", device="cpu", progress=False)
    generator = torch.Generator().manual_seed(5)
    image = torch.rand(1, 3, 64, 64, generator=generator) * 2 - 1
    noise = torch.randn(1, 16, 8, generator=generator)
    points = torch.rand(300, 3, generator=generator) * 2 - 1  # three chunks, the last one padded
    latents = pipeline.generate(image, ShapeSettings(steps=4), noise=noise, decode=False).latents
    vae = pipeline.model.vae
    with torch.no_grad():
        sdf = vae.query(points[None], vae.geometry_kv(vae.decode_latents(latents))).numpy()
    got_latents, got_sdf = deploy.load(tmp_path).generate(image.numpy(), noise.numpy(), points.numpy())
    np.testing.assert_allclose(got_latents, latents.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(got_sdf, sdf, rtol=0, atol=ATOL)
    assert isinstance(GeometryKV(*deploy.load(tmp_path).geometry(got_latents)).keys, np.ndarray)


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ExportError, match="'encoder' is not a part of pi0; its parts: vision, prefix, denoise_step"):
        export_model("pi0-tiny", tmp_path / "a", parts=["vision", "encoder"])
    with pytest.raises(ExportError, match="--opset 16 is too old for op LayerNormalization in part 'vae_query'"):
        export_model("hunyuan3d-tiny", tmp_path / "b", parts=["vae_query"], chunk=8, opset=16)
    with pytest.raises(ExportError, match="neither a checkpoint directory nor a preset"):
        export_model("no-such-model", tmp_path / "c")
    (tmp_path / "d").mkdir()
    with pytest.raises(ManifestError, match="not an exported model"):
        deploy.load(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text('{"format": "embodied-accel-onnx", "version": 1, "graphs": []}')
    with pytest.raises(ManifestError, match="missing field 'family'|graphs: empty"):
        deploy.load(tmp_path / "d")
    assert cli.main(["export", "--model", "pi0-tiny", "-o", str(tmp_path / "e"), "--parts", "decoder"]) == 2
    assert "'decoder' is not a part of pi0" in capsys.readouterr().err


def _tensorrt_ready() -> bool:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _tensorrt_ready(), reason="needs TensorRT (pip install tensorrt) and an NVIDIA GPU")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_tensorrt_engines_build_from_an_export(tmp_path, precision):
    from embodied_accel.export.tensorrt import ENGINES_FILE, build_engines

    export_model("pi0-tiny", tmp_path)
    engines = build_engines(tmp_path, precision)
    assert [p.name for p in engines] == [f"{s}_b1.{precision}.plan" for s in ("vision", "prefix", "denoise_step")]
    assert all(p.stat().st_size > 0 for p in engines) and (tmp_path / ENGINES_FILE).is_file()
