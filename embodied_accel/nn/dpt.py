"""DPT dense-prediction head (Ranftl et al., "Vision Transformers for Dense Prediction"), as VGGT uses it.

Four transformer layers' patch tokens are LayerNormed, projected (1×1), resized to four scales (×4, ×2, ×1, ×½),
fused coarse-to-fine by RefineNet blocks, upsampled to the image size and turned into per-pixel outputs. The
sinusoidal "uv" position embeddings it adds depend only on the image size: they are built once per size
(:func:`dpt_position_embeddings`) and handed to the forward.

Quirk kept for parity: the residual units use in-place ReLUs, so a unit returns ``conv2(relu(conv1(relu(x)))) +
relu(x)``, the residual being the *activated* input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear


@dataclass(frozen=True)
class DptConfig:
    dim_in: int  # token width (VGGT: 2 × aggregator width)
    patch_size: int = 14
    features: int = 256
    out_channels: tuple[int, int, int, int] = (256, 512, 1024, 1024)
    layers: tuple[int, int, int, int] = (4, 11, 17, 23)  # which aggregator layers feed the four scales
    output_dim: int = 4  # channels of the last conv (values + 1 confidence); unused with feature_only
    activation: str = "inv_log"  # of the values: inv_log | exp | linear | relu | sigmoid
    conf_activation: str = "expp1"  # of the confidence: expp1 | expp0 | sigmoid
    pos_embed: bool = True
    feature_only: bool = False  # return the fused features (track head) instead of predictions
    down_ratio: int = 1
    norm_eps: float = 1e-5
    head_hidden: int = 32  # channels of the last hidden conv


class Conv2d(nn.Module):
    """Weights of a 2-D convolution (or a transposed one), optionally grouped; applied functionally by the owner.

    ``in_ch`` / ``out_ch`` are totals over the ``groups`` (PyTorch's layouts: ``[out, in / groups, k, k]``, transposed
    ``[in, out / groups, k, k]``)."""

    def __init__(
        self, in_ch: int, out_ch: int, kernel: int, bias: bool = True, transposed: bool = False, groups: int = 1
    ):
        super().__init__()
        shape = (in_ch, out_ch // groups, kernel, kernel) if transposed else (out_ch, in_ch // groups, kernel, kernel)
        self.groups = groups
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(out_ch)) if bias else None

    def conv(self, x: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, stride=stride, padding=padding, groups=self.groups)

    def conv_transpose(self, x: torch.Tensor, stride: int) -> torch.Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, stride=stride, groups=self.groups)


class ResidualConvUnit(nn.Module):
    def __init__(self, features: int, groups: int = 1):
        super().__init__()
        self.conv1 = Conv2d(groups * features, groups * features, 3, groups=groups)
        self.conv2 = Conv2d(groups * features, groups * features, 3, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` is an intermediate that nobody reads afterwards: activated in place (the residual is relu(x))."""
        x = F.relu(x, inplace=True)
        out = self.conv2.conv(F.relu(self.conv1.conv(x, padding=1), inplace=True), padding=1)
        return out.add_(x)


class GroupedConv1x1(nn.Module):
    """A (grouped) 1×1 convolution on a channels-last image as GEMMs on its NHWC rows (one batched GEMM with groups).

    The same arithmetic as the convolution, faster on CPUs than PyTorch's grouped 1×1 convolutions (which run group
    by group on a slow path). ``weight_t [G, C_in, C_out]`` (laid out by the loader). Inference only: the batched GEMM
    writes into its output (``out=``), which autograd does not support.
    """

    def __init__(self, channels: int, groups: int = 1):
        super().__init__()
        self.groups = groups
        self.weight_t = nn.Parameter(torch.empty(groups, channels // groups, channels // groups))
        self.bias = nn.Parameter(torch.empty(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, C, H, W]``, channels-last → ``[N, C, H, W]``, channels-last."""
        n, c, h, w = x.shape
        groups, c_in, c_out = self.weight_t.shape
        if groups == 1:
            out = torch.addmm(self.bias, x.permute(0, 2, 3, 1).reshape(-1, c), self.weight_t[0])
            return out.view(n, h, w, c_out).permute(0, 3, 1, 2)
        rows = x.permute(0, 2, 3, 1).reshape(-1, groups, c_in).transpose(0, 1)  # [G, N*H*W, c_in], a view
        bias = self.bias.view(groups, 1, c_out)
        if torch.compiler.is_compiling():  # compile and ONNX export: a strided out= view loses its layout there
            out = torch.baddbmm(bias, rows, self.weight_t).transpose(0, 1).reshape(n, h, w, groups * c_out)
            return out.permute(0, 3, 1, 2)
        out = x.new_empty(n, h, w, groups * c_out)
        torch.baddbmm(bias, rows, self.weight_t, out=out.view(-1, groups, c_out).transpose(0, 1))
        return out.permute(0, 3, 1, 2)


class PatchConvTranspose2d(nn.Module):
    """A (grouped) transposed convolution with stride = kernel size ``k`` (each input pixel paints its own k×k patch)
    on a channels-last image: per group one GEMM of the NHWC rows, then one copy that lays the patches out.

    The same sums as the convolution, faster than PyTorch's CPU transposed convolutions at the DPT's small inputs.
    ``weight [G, C_in, k·k·C_out]`` (columns: ky, kx, output channel; laid out by the loader from the checkpoint's
    ``[G·C_in, C_out, k, k]``), ``bias [G·C_out]``.
    """

    def __init__(self, channels: int, kernel: int, groups: int = 1):
        super().__init__()
        self.kernel, self.groups = kernel, groups
        per_group = channels // groups
        self.weight = nn.Parameter(torch.empty(groups, per_group, kernel * kernel * per_group))
        self.bias = nn.Parameter(torch.empty(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, C, H, W]``, channels-last → ``[N, C, k·H, k·W]``, channels-last."""
        n, c, h, w = x.shape
        groups, c_in, columns = self.weight.shape
        k = self.kernel
        c_out = columns // (k * k)
        rows = x.permute(0, 2, 3, 1).reshape(-1, groups, c_in).transpose(0, 1)  # [G, N*H*W, c_in], a view
        bias = self.bias.view(groups, 1, 1, c_out).expand(groups, 1, k * k, c_out).reshape(groups, 1, columns)
        patches = torch.baddbmm(bias, rows, self.weight).view(groups, n, h, w, k, k, c_out)
        out = patches.permute(1, 2, 4, 3, 5, 0, 6).reshape(n, h * k, w * k, groups * c_out)  # NHWC
        return out.permute(0, 3, 1, 2)


class FusionBlock(nn.Module):
    """RefineNet fusion: ``out_conv(upsample(rcu2(x + rcu1(skip))))`` (no skip for the coarsest level)."""

    def __init__(self, features: int, has_residual: bool = True, groups: int = 1):
        super().__init__()
        if has_residual:
            self.res_unit1 = ResidualConvUnit(features, groups)
        self.res_unit2 = ResidualConvUnit(features, groups)
        self.out_conv = GroupedConv1x1(groups * features, groups)
        self.has_residual = has_residual

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None, size: tuple[int, int]) -> torch.Tensor:
        if skip is not None:
            x = self.res_unit1(skip).add_(x)  # the unit's output is a fresh tensor: summed in place
        x = self.res_unit2(x)
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=True)  # channels-last in, channels-last out
        return self.out_conv(x)


def uv_position_embedding(
    channels: int, height: int, width: int, aspect: float, omega_0: float = 100.0
) -> torch.Tensor:
    """The DPT head's sinusoidal embedding of a normalized uv grid: ``[channels, height, width]`` fp32, ×0.1.

    The grid spans ±aspect/diag horizontally and ±1/diag vertically (diag = sqrt(aspect² + 1)), sampled at pixel
    centres of a ``height × width`` map; u and v each get ``channels / 2`` sin/cos features computed in float64.
    """
    diag = (aspect**2 + 1.0) ** 0.5
    span_x, span_y = aspect / diag, 1.0 / diag
    xs = torch.linspace(-span_x * (width - 1) / width, span_x * (width - 1) / width, steps=width, dtype=torch.float32)
    ys = torch.linspace(
        -span_y * (height - 1) / height, span_y * (height - 1) / height, steps=height, dtype=torch.float32
    )
    uu, vv = torch.meshgrid(xs, ys, indexing="xy")  # [height, width] each

    def sincos(pos: torch.Tensor, dim: int) -> torch.Tensor:
        omega = torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0)
        omega = 1.0 / omega_0**omega
        angles = pos.reshape(-1).to(torch.float64)[:, None] * omega[None, :]
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()

    emb = torch.cat([sincos(uu, channels // 2), sincos(vv, channels // 2)], dim=-1)  # [H*W, C]
    return (emb.view(height, width, channels) * 0.1).permute(2, 0, 1).contiguous()


@dataclass(frozen=True)
class DptPositionEmbeddings:
    """The DPT head's position embeddings for one image size: one per projected scale and one at full size."""

    projected: tuple[torch.Tensor, ...]  # 4 × [1, out_channels[i], patch_h, patch_w], channels-last
    output: torch.Tensor  # [1, features // 2, H / down_ratio, W / down_ratio], channels-last


def dpt_position_embeddings(
    cfg: DptConfig, height: int, width: int, device: torch.device, dtype: torch.dtype, heads: int = 1
) -> DptPositionEmbeddings:
    """Build the embeddings of a ``height × width`` image (parameter-free: heads of one config share them), repeated
    for ``heads`` heads run as one grouped pass (their channels stacked)."""
    ph, pw = height // cfg.patch_size, width // cfg.patch_size
    aspect = width / height
    channels_last = torch.channels_last

    def build(c: int, h: int, w: int) -> torch.Tensor:
        emb = uv_position_embedding(c, h, w, aspect).repeat(heads, 1, 1)
        return emb[None].to(device, dtype).contiguous(memory_format=channels_last)

    projected = tuple(build(c, ph, pw) for c in cfg.out_channels)
    oh, ow = int(ph * cfg.patch_size / cfg.down_ratio), int(pw * cfg.patch_size / cfg.down_ratio)
    output = build(cfg.features // 2, oh, ow)
    return DptPositionEmbeddings(projected, output)


def inverse_log(y: torch.Tensor) -> torch.Tensor:
    """``sign(y) * (exp(|y|) - 1)``."""
    return torch.expm1(torch.abs(y)).mul_(torch.sign(y))


_VALUE_ACTIVATIONS = {
    "inv_log": inverse_log,
    "exp": torch.exp,
    "linear": lambda y: y,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
}
_CONF_ACTIVATIONS = {"expp1": lambda c: c.exp().add_(1), "expp0": torch.exp, "sigmoid": torch.sigmoid}


class DptHeadInput(nn.Module):
    """What each head of a :class:`DptHead` has of its own: the token LayerNorm and the four projections (1×1
    convolutions as GEMMs)."""

    def __init__(self, cfg: DptConfig, ops: OpSet):
        super().__init__()
        self.norm_weight = nn.Parameter(torch.empty(cfg.dim_in))
        self.norm_bias = nn.Parameter(torch.empty(cfg.dim_in))
        self.projects = nn.ModuleList(Linear(cfg.dim_in, oc, ops) for oc in cfg.out_channels)  # 1×1 convs as GEMMs


_PER_HEAD_FIELDS = ("output_dim", "activation", "conf_activation")


class DptHead(nn.Module):
    """One DPT head, or several of the same shape run as one pass (VGGT's depth and point heads).

    Tokens of four layers → per-pixel ``(values [N, H, W, C-1], confidence [N, H, W])`` per head, or features. Each
    head keeps its LayerNorm and projections; the convolutions after them run once for all heads as grouped
    convolutions over the stacked channels, the last 1×1 as one block-diagonal GEMM
    (:meth:`block_diagonal_parameters`). The same arithmetic as separate heads, in fewer calls.
    """

    def __init__(self, cfgs: DptConfig | tuple[DptConfig, ...], ops: OpSet):
        super().__init__()
        cfgs = (cfgs,) if isinstance(cfgs, DptConfig) else tuple(cfgs)
        cfg = cfgs[0]
        for other in cfgs:
            if other.activation not in _VALUE_ACTIVATIONS or other.conf_activation not in _CONF_ACTIVATIONS:
                raise ValueError(f"unknown DPT activation {other.activation!r} / {other.conf_activation!r}")
            shared = {k: v for k, v in other.__dict__.items() if k not in _PER_HEAD_FIELDS}
            if shared != {k: v for k, v in cfg.__dict__.items() if k not in _PER_HEAD_FIELDS}:
                raise ValueError("heads run as one pass must share every setting but their outputs and activations")
        self.cfgs, self.cfg, self.ops = cfgs, cfg, ops
        g = len(cfgs)
        c, f = cfg.out_channels, cfg.features
        self.heads = nn.ModuleList(DptHeadInput(head, ops) for head in cfgs)
        self.resize0 = PatchConvTranspose2d(g * c[0], 4, groups=g)
        self.resize1 = PatchConvTranspose2d(g * c[1], 2, groups=g)
        self.resize3 = Conv2d(g * c[3], g * c[3], 3, groups=g)
        self.layer_rn = nn.ModuleList(Conv2d(g * oc, g * f, 3, bias=False, groups=g) for oc in c)
        self.refine = nn.ModuleList(
            [FusionBlock(f, groups=g), FusionBlock(f, groups=g), FusionBlock(f, groups=g),
             FusionBlock(f, has_residual=False, groups=g)]
        )  # fmt: skip
        if cfg.feature_only:
            self.output_conv1 = Conv2d(g * f, g * f, 3, groups=g)
        else:
            self.output_conv1 = Conv2d(g * f, g * (f // 2), 3, groups=g)
            self.output_conv2a = Conv2d(g * (f // 2), g * cfg.head_hidden, 3, groups=g)
            self.output_conv2b = Linear(g * cfg.head_hidden, sum(head.output_dim for head in cfgs), ops)

    def block_diagonal_parameters(self) -> dict[str, list[tuple[int, ...]]]:
        """The parameters that hold one diagonal block per head (zeros elsewhere) when several heads run as one
        pass: name → each head's block, ``(out, in)`` for the ``weight_t`` matrices (stored ``[in, out]``) and
        ``(out,)`` for their biases (concatenated). Empty for a single head."""
        if len(self.cfgs) == 1:
            return {}
        blocks = {}
        if not self.cfg.feature_only:
            hidden = self.cfg.head_hidden
            blocks["output_conv2b.weight_t"] = [(head.output_dim, hidden) for head in self.cfgs]
            blocks["output_conv2b.bias"] = [(head.output_dim,) for head in self.cfgs]
        return blocks

    def forward(
        self,
        layer_tokens: list[torch.Tensor],
        patch_hw: tuple[int, int],
        pos: DptPositionEmbeddings | None,
        frames_chunk_size: int | None = 8,
    ):
        """``layer_tokens``: the four layers' patch tokens ``[N, patch_h * patch_w, dim_in]`` (N frames).

        Frames are processed ``frames_chunk_size`` at a time (memory); each frame is independent, so the chunking
        does not change the result. Returns ``features [N, F, H', W']`` with ``feature_only``, else per head
        ``(values [N, H, W, output_dim - 1], confidence [N, H, W])`` (a list of them with several heads).
        """
        frames = layer_tokens[0].shape[0]
        chunk = frames if not frames_chunk_size or frames_chunk_size >= frames else frames_chunk_size
        outs = [
            self._forward_frames([t[s : s + chunk] for t in layer_tokens], patch_hw, pos)
            for s in range(0, frames, chunk)
        ]
        if self.cfg.feature_only:
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        per_head = [
            (torch.cat([o[h][0] for o in outs]), torch.cat([o[h][1] for o in outs])) if len(outs) > 1 else outs[0][h]
            for h in range(len(self.cfgs))
        ]
        return per_head[0] if len(per_head) == 1 else per_head

    def _forward_frames(self, layer_tokens: list[torch.Tensor], patch_hw: tuple[int, int], pos):
        cfg, ops = self.cfg, self.ops
        ph, pw = patch_hw
        scales = []
        for i, tokens in enumerate(layer_tokens):
            n = tokens.shape[0]
            flat = tokens.reshape(-1, cfg.dim_in)
            projected = [
                head.projects[i](ops.layer_norm(flat, head.norm_weight, head.norm_bias, cfg.norm_eps))
                for head in self.heads
            ]
            x = projected[0] if len(projected) == 1 else torch.cat(projected, dim=1)
            # The projection's [N * h * w, C] rows are already an NHWC image: a channels-last view, no copy (the
            # convolutions below run channels-last, several times faster on CPUs than NCHW for these shapes).
            x = x.view(n, ph, pw, -1).permute(0, 3, 1, 2)
            if cfg.pos_embed:
                x = x.add_(pos.projected[i])  # x views the projection's fresh output
            if i == 0:
                x = self.resize0(x)  # ×4
            elif i == 1:
                x = self.resize1(x)  # ×2
            elif i == 3:
                x = self.resize3.conv(x, stride=2, padding=1)
            scales.append(x)
        rn = [conv.conv(x, padding=1) for conv, x in zip(self.layer_rn, scales, strict=True)]
        out = self.refine[3](rn[3], None, rn[2].shape[2:])
        out = self.refine[2](out, rn[2], rn[1].shape[2:])
        out = self.refine[1](out, rn[1], rn[0].shape[2:])
        out = self.refine[0](out, rn[0], (rn[0].shape[2] * 2, rn[0].shape[3] * 2))
        out = self.output_conv1.conv(out, padding=1)
        size = (int(ph * cfg.patch_size / cfg.down_ratio), int(pw * cfg.patch_size / cfg.down_ratio))
        out = F.interpolate(out, size=size, mode="bilinear", align_corners=True)
        if cfg.pos_embed:
            out = out.add_(pos.output)  # the interpolation's fresh output
        if cfg.feature_only:
            return out
        hidden = F.relu(self.output_conv2a.conv(out, padding=1), inplace=True)  # [N, heads * 32, H, W], channels-last
        n, c, h, w = hidden.shape
        fmaps = self.output_conv2b(hidden.permute(0, 2, 3, 1).reshape(-1, c))  # NHWC rows: [N*H*W, sum of outputs]
        results, start = [], 0
        for head_cfg in self.cfgs:
            fmap = fmaps[:, start : start + head_cfg.output_dim].view(n, h, w, -1)  # [N, H, W, C]
            start += head_cfg.output_dim
            values = _VALUE_ACTIVATIONS[head_cfg.activation](fmap[..., :-1])
            conf = _CONF_ACTIVATIONS[head_cfg.conf_activation](fmap[..., -1])
            results.append((values, conf))
        return results
