"""DPT heads run as one pass (grouped convolutions over stacked channels) equal the same heads run separately."""

import torch

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
    pair = DptHead((depth_cfg, point_cfg), OPS)
    randomize(pair, 0)
    single = {name: DptHead(cfg, OPS) for name, cfg in (("depth", depth_cfg), ("point", point_cfg))}
    for k, head in enumerate(single.values()):
        with torch.no_grad():
            for name, p in head.named_parameters():
                if name.startswith("heads.0."):
                    p.copy_(pair.get_parameter(name.replace("heads.0.", f"heads.{k}.")))
                else:  # the k-th slice of the stacked tensor
                    full = pair.get_parameter(name)
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
    for ours, ref in (
        (depth, ref_depth),
        (depth_conf, ref_depth_conf),
        (points, ref_points),
        (points_conf, ref_points_conf),
    ):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)  # exp / inv_log amplify 1e-7 rounding
