"""GR00T N1.7 cases found by comparing with the official code on randomized configurations
(``tools/groot_reference/differential_n17.py``), each reproduced here without it."""

from __future__ import annotations

import torch
from test_groot_n17_model import HEAD, TINY, checkpoint_tensors, load, write_checkpoint

from embodied_accel.models.groot.n17_config import sinusoid_table
from embodied_accel.models.groot.n17_model import GrootN17Bucket, build_n17_buffers

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
