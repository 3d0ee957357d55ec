"""``attention_lse`` (sequence-parallel VGGT's global layers) without a full score matrix: the blocked path equals the
textbook formula within fp32 rounding, and its largest intermediate is one block of scores."""

import pytest
import torch
from tolerances import assert_rounding_close
from torch.utils._python_dispatch import TorchDispatchMode

from embodied_accel.ops import reference

PADDING = -1e30  # parallel/attention.py's bias for a padding key: large, negative, finite


def textbook_attention_lse(q, k, v, key_bias, scale):
    """The formula with the whole ``[Sq, Sk]`` score matrix in fp32 (what the op computed off the CPU before)."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if key_bias is not None:
        scores = scores + key_bias.to(q.dtype).float()
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v.float()).to(q.dtype), lse


def inputs(batch, heads, queries, keys, dim, padded_from=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, dim, generator=generator) for n in (queries, keys, keys))
    bias = None
    if padded_from is not None:
        bias = torch.zeros(keys)
        bias[padded_from:] = PADDING
    return q, k * 2, v, bias


class LargestOutput(TorchDispatchMode):
    """The most elements any aten op of the block produced (every intermediate is some op's output)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize(
    "batch,heads,queries,keys,dim,padded_from,block",
    [(1, 2, 37, 101, 16, None, 256), (2, 3, 5, 300, 8, 250, 64), (1, 1, 64, 64, 32, 0, 1 << 24), (1, 4, 9, 33, 8, 7, 7)],
)
def test_blocked_attention_lse_equals_the_textbook_formula(batch, heads, queries, keys, dim, padded_from, block):
    """Odd sizes off the blocks, padding keys (all of them in one case: a finite, very negative lse), one block
    holding everything, and a block smaller than one row per head (one key at a time)."""
    q, k, v, bias = inputs(batch, heads, queries, keys, dim, padded_from)
    out, lse = reference.attention_lse(q, k, v, bias, dim**-0.5, block_elements=block)
    expected_out, expected_lse = textbook_attention_lse(q, k, v, bias, dim**-0.5)
    if padded_from == 0:  # every key padding: all scores round to the bias, so every key weighs the same
        expected_out = v.mean(dim=2, keepdim=True).expand_as(q)  # (the textbook's exp(s - lse) misses log(Sk) here)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    assert torch.isfinite(lse).all()
    # a sum of `keys` terms in either order, then exp / log / a division: a few dependent roundings
    assert_rounding_close(out, expected_out, terms=keys, chain=4)
    assert_rounding_close(lse, expected_lse, terms=keys, chain=4, scale=expected_lse.abs().max().clamp_max(1e3))
    cpu_out, cpu_lse = reference.attention_lse(q, k, v, bias, dim**-0.5)  # the CPU's flash kernel: the same values
    if padded_from != 0:
        assert_rounding_close(cpu_out, expected_out, terms=keys, chain=4)
        assert_rounding_close(cpu_lse, lse, terms=keys, chain=4)


def test_blocked_attention_lse_never_builds_the_score_matrix():
    batch, heads, queries, keys, dim, block = 1, 2, 300, 500, 4, 4096
    q, k, v, bias = inputs(batch, heads, queries, keys, dim, padded_from=450)
    with LargestOutput() as seen:
        out, lse = reference.attention_lse(q, k, v, bias, 0.5, block_elements=block)
    full = batch * heads * queries * keys  # 300k scores: what the textbook formula holds at once
    assert seen.largest <= max(block, out.numel()) < full // 50, seen.largest
    assert_rounding_close(out, textbook_attention_lse(q, k, v, bias, 0.5)[0], terms=keys, chain=4)


def test_blocks_fit_the_budget():
    assert reference.attention_lse_blocks(32, 5000, 5000, 1 << 24) == (128, 4096)  # 32 x 128 x 4096 = 2^24 scores
    assert reference.attention_lse_blocks(4, 3, 10, 1 << 24) == (3, 10)  # everything in one block
    assert reference.attention_lse_blocks(64, 100, 100, 16) == (1, 1)  # fewer than a row per head: one key at a time
    with pytest.raises(ValueError, match="block_elements"):
        reference.attention_lse_blocks(1, 1, 1, 0)
