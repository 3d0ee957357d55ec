"""A frozen fixture for the UNet reader's diffusers options: a tiny ``UNet2DConditionModel`` folder whose
``config.json`` sets the options that change tensor shapes away from Stable Diffusion's defaults, and one forward.

Needs only torch and diffusers 0.32.2 (no Hunyuan3D-2 checkout), never runs in CI:

    pip install --target /tmp/diffusers-only --no-deps diffusers==0.32.2 "huggingface_hub<0.30" regex requests \
        importlib_metadata zipp urllib3 idna certifi charset_normalizer
    PYTHONPATH=/tmp/diffusers-only python tools/hunyuan3d_paint_reference/make_unet_fixture.py \
        --out tests/fixtures/hunyuan3d_paint_models/unet-options-tiny

The folder holds ``config.json`` and ``diffusion_pytorch_model.safetensors`` (``save_pretrained``, seeded random
weights: every tensor, stored in float16 as the other fixtures' are) and ``io.safetensors``:
``sample [2, 4, 8, 8]``, ``timestep`` (one, 0-d), ``encoder [2, 7, 16]`` and diffusers' ``out [2, 4, 8, 8]`` in float32.
The options: ``time_embedding_dim`` 40 (not 4 × 16), ``conv_in_kernel`` 5, ``conv_out_kernel`` 1,
``resnet_time_scale_shift`` ``"scale_shift"`` (time projections twice as wide: a scale and a shift after ``norm2``),
``use_linear_projection`` and ``upcast_attention`` true, ``projection_class_embeddings_input_dim`` set (read by
diffusers only with a class or addition embedding, so without effect), two transformer layers at the first level.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_model_fixtures import randomize, save_tensors  # noqa: E402

CONFIG = {
    "sample_size": 8, "in_channels": 4, "out_channels": 4, "block_out_channels": [16, 32],
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"], "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
    "mid_block_type": "UNetMidBlock2DCrossAttn", "layers_per_block": 1, "attention_head_dim": [2, 4],
    "transformer_layers_per_block": [2, 1], "cross_attention_dim": 16, "norm_num_groups": 4,
    "use_linear_projection": True, "upcast_attention": True, "time_embedding_dim": 40, "conv_in_kernel": 5,
    "conv_out_kernel": 1, "projection_class_embeddings_input_dim": 12, "resnet_time_scale_shift": "scale_shift",
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/hunyuan3d_paint_models/unet-options-tiny"))
    parser.add_argument("--seed", type=int, default=300)
    args = parser.parse_args()
    import safetensors.torch  # noqa: F401  (diffusers saves through it without importing it)
    from diffusers import UNet2DConditionModel

    torch.set_num_threads(1)
    unet = UNet2DConditionModel(**CONFIG)
    randomize(unet, args.seed)
    unet.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    unet.to(torch.float16).save_pretrained(str(args.out), safe_serialization=True)  # exact: already float16 values
    unet.to(torch.float32)
    generator = torch.Generator().manual_seed(args.seed + 1)
    sample = torch.randn(2, 4, 8, 8, generator=generator)
    timestep = torch.tensor(261.0)
    encoder = torch.randn(2, 7, 16, generator=generator)
    with torch.no_grad():
        out = unet(sample, timestep, encoder_hidden_states=encoder).sample
    save_tensors(args.out / "io.safetensors", {"sample": sample, "timestep": timestep, "encoder": encoder, "out": out})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
