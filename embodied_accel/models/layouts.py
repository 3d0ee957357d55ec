"""Rule-table rows for checkpoint layouts that several families read (see :mod:`.loading`)."""

from __future__ import annotations

import torch

from .loading import KeyRule, linear


def siglip_layer_rows(ours: str, theirs: str, dtype: torch.dtype | None = None) -> tuple[KeyRule, ...]:
    """A transformers SigLIP encoder layer (``{theirs}.self_attn.{q,k,v,out}_proj``, ``layer_norm{1,2}``,
    ``mlp.fc{1,2}``; pi0's and GR00T N1.6's vision towers) into :class:`~embodied_accel.nn.siglip.SiglipLayer`:
    ``ours`` is the pattern of our layer's name with one group (the layer index), ``theirs`` its template (``\\1``)."""
    qkv = [f"{theirs}.self_attn.{p}_proj" for p in "qkv"]
    return (
        KeyRule(rf"{ours}\.qkv\.weight_t", tuple(f"{k}.weight" for k in qkv), "cat_t", dtype=dtype),
        KeyRule(rf"{ours}\.qkv\.bias", tuple(f"{k}.bias" for k in qkv), "cat", dtype=dtype),
        *linear(rf"{ours}\.out", f"{theirs}.self_attn.out_proj", dtype),
        *linear(rf"{ours}\.(fc[12])", rf"{theirs}.mlp.\2", dtype),
        KeyRule(rf"{ours}\.layer_norm([12])_(weight|bias)", (rf"{theirs}.layer_norm\2.\3",), dtype=dtype),
    )
