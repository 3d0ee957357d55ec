"""DPT heads run as one pass (grouped convolutions over stacked channels, a block-diagonal last 1×1 GEMM) equal the
same heads run separately."""

import torch
from tolerances import assert_rounding_close, rounding_tolerance

from embodied_accel.models.vggt.config import get_preset
from embodied_accel.nn.dpt import DptHead, dpt_position_embeddings
from embodied_accel.ops import get_ops

OPS = get_ops("reference")


def randomize(module, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / max(1, p[0].numel()) ** 0.5)


def test_paired_heads_equal_separate_heads():
    config = get_preset("vggt-tiny")
    depth_cfg, point_cfg = config.depth_dpt(), config.point_dpt()
    pair = DptHead((depth_cfg, point_cfg), OPS).requires_grad_(False)  # inference weights, as the loader leaves them
    randomize(pair, 0)
    blocks = pair.block_diagonal_parameters()
    assert set(blocks) == {"output_conv2b.weight_t", "output_conv2b.bias"}
    with torch.no_grad():
        for name, shapes in blocks.items():
            if name.endswith("weight_t"):  # zeros off the diagonal blocks: the heads stay independent
                mask = torch.block_diag(*[torch.ones(s[1], s[0]) for s in shapes])
                pair.get_parameter(name).mul_(mask)
    single = {
        name: DptHead(cfg, OPS).requires_grad_(False) for name, cfg in (("depth", depth_cfg), ("point", point_cfg))
    }
    assert single["depth"].block_diagonal_parameters() == {}
    for k, head in enumerate(single.values()):
        with torch.no_grad():
            for name, p in head.named_parameters():
                full = pair.get_parameter(name.replace("heads.0.", f"heads.{k}."))
                if name.startswith("heads.0."):
                    p.copy_(full)
                elif name in blocks:  # the k-th diagonal block (weight_t: [in, out]) or bias slice
                    out_start = sum(s[0] for s in blocks[name][:k])
                    out_rows = slice(out_start, out_start + blocks[name][k][0])
                    if name.endswith("weight_t"):
                        in_start = sum(s[1] for s in blocks[name][:k])
                        p.copy_(full[in_start : in_start + blocks[name][k][1], out_rows])
                    else:
                        p.copy_(full[out_rows])
                else:  # the k-th slice of the stacked tensor
                    p.copy_(full.chunk(2, dim=0)[k])
    frames, (ph, pw) = 3, (3, 5)
    gen = torch.Generator().manual_seed(1)
    tokens = [torch.randn(frames, ph * pw, depth_cfg.dim_in, generator=gen) for _ in range(4)]
    pos_pair = dpt_position_embeddings(depth_cfg, 42, 70, torch.device("cpu"), torch.float32, heads=2)
    pos_single = dpt_position_embeddings(depth_cfg, 42, 70, torch.device("cpu"), torch.float32)
    (depth, depth_conf), (points, points_conf) = pair(tokens, (ph, pw), pos_pair, frames_chunk_size=2)
    ref_depth, ref_depth_conf = single["depth"](tokens, (ph, pw), pos_single)
    ref_points, ref_points_conf = single["point"](tokens, (ph, pw), pos_single)
    assert depth.shape == (3, 42, 70, 1) and points.shape == (3, 42, 70, 3)
    # the heads' pre-activations x: sums of at most 288 terms (3x3 convolutions over 32 channels), about 20 layers
    # deep; exp / expm1 turn x's absolute error into the output's relative error, so the bound grows by 1 + max|x|
    tolerance = rounding_tolerance(terms=288, chain=20)
    for ours, ref, argument in (
        (depth, ref_depth, ref_depth.log()),
        (depth_conf, ref_depth_conf, (ref_depth_conf - 1).log()),
        (points, ref_points, ref_points.abs().log1p()),
        (points_conf, ref_points_conf, (ref_points_conf - 1).log()),
    ):
        amplified = tolerance * (1 + argument.abs().max().item())
        torch.testing.assert_close(ours, ref, rtol=amplified, atol=amplified)


def test_gemm_convolutions_equal_the_convolutions_they_replace():
    """The DPT's 1×1 and ×k transposed convolutions run as GEMMs on kernels the loader lays out (GEMM_KERNELS)."""
    from embodied_accel.models.vggt.weights import _gemm_kernel_layout, _gemm_kernel_source_shape, gemm_kernel_kind
    from embodied_accel.nn.dpt import GroupedConv1x1, PatchConvTranspose2d

    gen = torch.Generator().manual_seed(2)
    for groups in (1, 2):
        x = torch.randn(3, 8 * groups, 5, 7, generator=gen).contiguous(memory_format=torch.channels_last)
        conv = GroupedConv1x1(8 * groups, groups).requires_grad_(False)
        kind = gemm_kernel_kind("dense_heads.refine.0.out_conv.weight_t")
        per_head = _gemm_kernel_source_shape(kind, tuple(conv.weight_t.shape))
        kernels = [torch.randn(per_head, generator=gen) for _ in range(groups)]
        conv.weight_t.copy_(_gemm_kernel_layout(kind, kernels))
        conv.bias.copy_(torch.randn(8 * groups, generator=gen))
        ref = torch.nn.functional.conv2d(x, torch.cat(kernels), conv.bias, groups=groups)
        assert_rounding_close(conv(x), ref, terms=8, chain=2)  # 8 input channels per output, plus the bias
        assert conv(x).is_contiguous(memory_format=torch.channels_last)

        for k in (2, 4):
            up = PatchConvTranspose2d(8 * groups, k, groups).requires_grad_(False)
            kind = gemm_kernel_kind(f"dense_heads.resize{k // 4}.weight")
            per_head = _gemm_kernel_source_shape(kind, tuple(up.weight.shape))
            assert per_head == (8, 8, k, k)
            kernels = [torch.randn(per_head, generator=gen) for _ in range(groups)]
            up.weight.copy_(_gemm_kernel_layout(kind, kernels))
            up.bias.copy_(torch.randn(8 * groups, generator=gen))
            ref = torch.nn.functional.conv_transpose2d(x, torch.cat(kernels), up.bias, stride=k, groups=groups)
            assert_rounding_close(up(x), ref, terms=8, chain=2)  # each output pixel: 8 channels of one input pixel
            assert up(x).is_contiguous(memory_format=torch.channels_last)
