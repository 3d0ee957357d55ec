"""GR00T N1.7 cases found by comparing with the official code on randomized configurations
(``tools/groot_reference/differential_n17.py``), each reproduced here without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_groot_n17_model import HEAD, TINY, checkpoint_tensors, load, write_checkpoint

from embodied_accel.models.groot.n17_config import sinusoid_table
from embodied_accel.models.groot.n17_embodiment import image_settings
from embodied_accel.models.groot.n17_images import crop_and_resize, patchify, qwen_resize
from embodied_accel.models.groot.n17_model import GrootN17Bucket, build_n17_buffers
from embodied_accel.models.groot.processor import EmbodimentError

PE = f"{HEAD}.vl_self_attention.transformer_blocks.0.pos_embed.pe"


def test_a_bf16_sinusoid_table_is_accepted_and_used_as_stored(tmp_path):
    """The official checkpoints are bf16, the sinusoid table of the vl self-attention included (a diffusers buffer,
    saved with the weights); the official model adds the loaded, rounded table. The loader takes it (within bf16's
    rounding of the computed table) and the model adds exactly the stored values, not the fp32 recomputation."""
    tensors = checkpoint_tensors()
    tensors[PE] = tensors[PE].to(torch.bfloat16)
    model = load(write_checkpoint(tmp_path / "ckpt", tensors))
    stored = tensors[PE].float()[0]
    exact = sinusoid_table(512, TINY.backbone_width)
    assert (stored - exact).abs().max() > 1e-4  # the rounding is visible at the parity tolerance
    bucket = GrootN17Bucket(batch=1, image_grid_thw=((1, 4, 4),), seq_len=32)
    table = build_n17_buffers(model, bucket, "cpu").vl_positions
    torch.testing.assert_close(table[1:], stored[:32], rtol=0, atol=0)  # row j: position j - 1
    torch.testing.assert_close(table[0], stored[0], rtol=0, atol=0)


def test_an_fp32_sinusoid_table_is_used_as_stored(tmp_path):
    model = load(write_checkpoint(tmp_path / "ckpt", checkpoint_tensors()))
    table = build_n17_buffers(model, GrootN17Bucket(batch=1, image_grid_thw=((1, 4, 4),), seq_len=32), "cpu")
    torch.testing.assert_close(table.vl_positions[1:], sinusoid_table(32, TINY.backbone_width), rtol=0, atol=0)


def test_torchvision_transforms_with_a_non_square_target_and_crop():
    """``use_albumentations`` false with ``image_target_size`` [64, 96] and ``image_crop_size`` [60, 90]: the
    official transforms letterbox, resize to 64 x 96, centre-crop 60 x 90 at (round(2), round(3)) and resize back;
    the frame then gives a 4 x 6 patch grid (6 tokens)."""
    kw = {"use_albumentations": False, "image_target_size": [64, 96], "image_crop_size": [60, 90]}
    settings = image_settings(kw, {"size": {"shortest_edge": 64 * 64, "longest_edge": 1 << 24}})
    assert settings.torchvision_sizes == ((64, 96), (60, 90))
    frame = np.random.default_rng(0).integers(0, 256, size=(40, 70, 3), dtype=np.uint8)
    ours = crop_and_resize(frame, settings)
    square = np.zeros((70, 70, 3), np.uint8)
    square[15:55] = frame  # letterbox: (70 - 40) // 2 rows on top
    image = torch.from_numpy(square).permute(2, 0, 1)[None]
    resized = F.interpolate(image, size=[64, 96], mode="bilinear", antialias=True)
    expected = F.interpolate(resized[..., 2:62, 3:93], size=[64, 96], mode="bilinear", antialias=True)
    np.testing.assert_allclose(ours.astype(int), expected[0].permute(1, 2, 0).numpy().astype(int), rtol=0, atol=1)
    _, grid = patchify(qwen_resize(ours, settings), settings)
    assert grid == (1, 4, 6)
    with pytest.raises(EmbodimentError, match="image_crop_size <= image_target_size"):
        image_settings({**kw, "image_crop_size": [60, 100]}, {})


def test_an_n17_checkpoint_with_an_n16_preset_names_both(tmp_path):
    from embodied_accel.errors import CheckpointError
    from embodied_accel.models.groot.n17_weights import n17_config_from_checkpoint

    directory = write_checkpoint(tmp_path / "ckpt", {})
    with pytest.raises(CheckpointError, match="Gr00tN1d7.*N1.7 checkpoint.*'groot-n1.6' is not an N1.7 preset"):
        n17_config_from_checkpoint(directory, preset="groot-n1.6")
