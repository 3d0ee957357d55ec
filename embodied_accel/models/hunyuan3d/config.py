"""Architecture configs and named presets for Hunyuan3D-2 shape generation.

A released model directory (``tencent/Hunyuan3D-2/hunyuan3d-dit-v2-0``, ``...-fast``, ``...-turbo``,
``tencent/Hunyuan3D-2mini/hunyuan3d-dit-v2-mini``, ...) holds ``config.yaml`` with four sections this module reads:
``model`` (the DiT), ``vae`` (the ShapeVAE decoder), ``conditioner`` (DINOv2) and ``image_processor``; the scheduler
section only says "flow matching, 1000 training steps". :func:`config_from_yaml` turns it into a
:class:`Hunyuan3DConfig`, rejecting what this library does not implement by name. Runtime knobs (backend, dtype,
steps, guidance, octree resolution, cache) are arguments of the pipeline, not part of these configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ...nn.vit import VitBlockConfig


@dataclass(frozen=True)
class DitConfig:
    """``Hunyuan3DDiT``: FLUX-style double- then single-stream blocks over [conditions | latents], no positions."""

    in_channels: int = 64
    context_in_dim: int = 1536
    hidden_size: int = 1024
    mlp_ratio: float = 4.0
    num_heads: int = 16
    depth: int = 16
    depth_single_blocks: int = 32
    qkv_bias: bool = True
    time_factor: float = 1000.0
    guidance_embed: bool = False  # the guidance-distilled ("fast", "turbo") models embed the CFG scale

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class VaeConfig:
    """``ShapeVAE`` (decoder only): latents → self-attention transformer → cross-attention geometry decoder."""

    num_latents: int = 3072
    embed_dim: int = 64
    width: int = 1024
    heads: int = 16
    num_decoder_layers: int = 16
    num_freqs: int = 8
    include_pi: bool = False
    qkv_bias: bool = False
    qk_norm: bool = True
    scale_factor: float = 0.9990943042622529
    geo_decoder_mlp_expand_ratio: int = 4
    geo_decoder_downsample_ratio: int = 1
    geo_decoder_ln_post: bool = True

    @property
    def fourier_dim(self) -> int:
        return 3 * (2 * self.num_freqs + 1)

    def block(self) -> VitBlockConfig:
        """The decoder transformer's blocks as :class:`VitBlockConfig` (pre-LN, QK-norm, no LayerScale)."""
        return VitBlockConfig(
            width=self.width, num_heads=self.heads, mlp_ratio=4.0, qk_norm=self.qk_norm, layerscale=False,
            norm_eps=1e-6, qk_norm_eps=1e-6, qkv_bias=self.qkv_bias,
        )  # fmt: skip


@dataclass(frozen=True)
class DinoConfig:
    """The DINOv2 image conditioner (transformers' ``Dinov2Model``; DINOv2-giant in the released models)."""

    hidden_size: int = 1536
    num_hidden_layers: int = 40
    num_attention_heads: int = 24
    patch_size: int = 14
    position_image_size: int = 518  # the learned position grid: (position_image_size // patch_size) squared
    mlp_ratio: float = 4.0
    use_swiglu_ffn: bool = True
    layer_norm_eps: float = 1e-6
    qkv_bias: bool = True
    image_size: int = 518  # the conditioner resizes and center-crops its input to this size
    use_cls_token: bool = True

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.grid**2 + (1 if self.use_cls_token else 0)

    def block(self) -> VitBlockConfig:
        """DINOv2's block; its LayerScales are folded into the attention projection and ``fc2`` at load."""
        return VitBlockConfig(
            width=self.hidden_size, num_heads=self.num_attention_heads, mlp_ratio=self.mlp_ratio, layerscale=False,
            norm_eps=self.layer_norm_eps, qkv_bias=self.qkv_bias, mlp="swiglu" if self.use_swiglu_ffn else "gelu",
        )  # fmt: skip


@dataclass(frozen=True)
class Hunyuan3DConfig:
    name: str
    dit: DitConfig = field(default_factory=DitConfig)
    vae: VaeConfig = field(default_factory=VaeConfig)
    dino: DinoConfig = field(default_factory=DinoConfig)
    processor_size: int = 512  # the image processor's output size (recentred foreground on a square canvas)
    border_ratio: float = 0.15
    num_train_timesteps: int = 1000
    scheduler: str = "flow_matching"  # "flow_matching" (Euler on linspace(0, 1, N)) or "consistency" (turbo)
    pcm_timesteps: int = 50  # the consistency scheduler's grid of training sigmas
    default_steps: int = 50  # what the model was made for: 50 (standard, fast), 5 (turbo)

    def validate(self) -> None:
        d, v, c = self.dit, self.vae, self.dino
        if d.hidden_size % d.num_heads:
            raise ValueError(
                f"{self.name}: DiT hidden_size {d.hidden_size} is not a multiple of num_heads {d.num_heads}"
            )
        if v.width % v.heads:
            raise ValueError(f"{self.name}: VAE width {v.width} is not a multiple of heads {v.heads}")
        if v.embed_dim != d.in_channels:
            raise ValueError(f"{self.name}: VAE embed_dim {v.embed_dim} != DiT in_channels {d.in_channels}")
        if c.hidden_size != d.context_in_dim:
            raise ValueError(f"{self.name}: DINOv2 width {c.hidden_size} != DiT context_in_dim {d.context_in_dim}")
        if self.scheduler not in ("flow_matching", "consistency"):
            raise ValueError(f"{self.name}: scheduler must be 'flow_matching' or 'consistency', got {self.scheduler!r}")
        if c.image_size % c.patch_size or c.position_image_size % c.patch_size:
            raise ValueError(f"{self.name}: DINOv2 image sizes must be multiples of the patch size {c.patch_size}")


_MINI_DIT = DitConfig(depth=8, depth_single_blocks=16)
_MINI_VAE = VaeConfig(num_latents=512)

#: Named architectures with seeded random weights (a real checkpoint's ``config.yaml`` is always what is used for
#: it). The 2.0 numbers are those of ``tencent/Hunyuan3D-2``'s ``config.yaml``; the mini numbers (8 + 16 blocks,
#: 512 latents) are its published size (0.6 B parameters) and should be checked against a real ``config.yaml``.
PRESETS: dict[str, Hunyuan3DConfig] = {
    "hunyuan3d-dit-v2-0": Hunyuan3DConfig("hunyuan3d-dit-v2-0"),
    "hunyuan3d-dit-v2-0-fast": Hunyuan3DConfig("hunyuan3d-dit-v2-0-fast", dit=DitConfig(guidance_embed=True)),
    "hunyuan3d-dit-v2-0-turbo": Hunyuan3DConfig(
        "hunyuan3d-dit-v2-0-turbo", dit=DitConfig(guidance_embed=True), scheduler="consistency", default_steps=5
    ),
    "hunyuan3d-dit-v2-mini": Hunyuan3DConfig("hunyuan3d-dit-v2-mini", dit=_MINI_DIT, vae=_MINI_VAE),
    "hunyuan3d-dit-v2-mini-fast": Hunyuan3DConfig(
        "hunyuan3d-dit-v2-mini-fast", dit=replace(_MINI_DIT, guidance_embed=True), vae=_MINI_VAE
    ),
    "hunyuan3d-dit-v2-mini-turbo": Hunyuan3DConfig(
        "hunyuan3d-dit-v2-mini-turbo",
        dit=replace(_MINI_DIT, guidance_embed=True),
        vae=_MINI_VAE,
        scheduler="consistency",
        default_steps=5,
    ),
    # the test fixture's architecture (tools/hunyuan3d_reference/make_fixtures.py)
    "hunyuan3d-tiny": Hunyuan3DConfig(
        "hunyuan3d-tiny",
        dit=DitConfig(in_channels=8, context_in_dim=32, hidden_size=32, num_heads=2, depth=2, depth_single_blocks=2),
        vae=VaeConfig(num_latents=16, embed_dim=8, width=32, heads=2, num_decoder_layers=2, num_freqs=4),
        dino=DinoConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, position_image_size=42, image_size=56
        ),
        processor_size=64,
    ),
}


def get_preset(name: str) -> Hunyuan3DConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown Hunyuan3D preset {name!r}; presets: {', '.join(PRESETS)}") from None


# ---- config.yaml -----------------------------------------------------------------------------------------------

_DIT_KEYS = {
    "in_channels", "context_in_dim", "hidden_size", "mlp_ratio", "num_heads", "depth", "depth_single_blocks",
    "qkv_bias", "time_factor", "guidance_embed",
}  # fmt: skip
_DIT_IGNORED = {"axes_dim", "theta", "ckpt_path"}  # positional-embedding settings of a model that has none
_VAE_KEYS = {
    "num_latents", "embed_dim", "width", "heads", "num_decoder_layers", "num_freqs", "include_pi", "qkv_bias",
    "qk_norm", "scale_factor", "geo_decoder_mlp_expand_ratio", "geo_decoder_downsample_ratio", "geo_decoder_ln_post",
}  # fmt: skip
_VAE_IGNORED = {"label_type", "drop_path_rate"}
_DINO_RENAMES = {
    "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads", "patch_size": "patch_size", "image_size": "position_image_size",
    "mlp_ratio": "mlp_ratio", "use_swiglu_ffn": "use_swiglu_ffn", "layer_norm_eps": "layer_norm_eps",
    "qkv_bias": "qkv_bias",
}  # fmt: skip


def _section(data: dict, key: str, path: Path) -> dict:
    section = data.get(key)
    if not isinstance(section, dict):
        raise CheckpointError(f"{path}: no {key!r} section (expected a Hunyuan3D-2 shape model's config.yaml)")
    return section


def _params(section: dict, name: str, path: Path, target_suffix: str) -> dict:
    target = str(section.get("target", ""))
    if not target.endswith(target_suffix):
        raise CheckpointError(
            f"{path}: {name}.target is {target!r}; this library runs {target_suffix} (Hunyuan3D-2 / 2mini / 2mv "
            "shape models)"
        )
    params = section.get("params", {})
    if not isinstance(params, dict):
        raise CheckpointError(f"{path}: {name}.params must be a mapping")
    return params


def _pick(params: dict, known: set, ignored: set, name: str, path: Path) -> dict:
    unknown = sorted(set(params) - known - ignored)
    if unknown:
        raise CheckpointError(
            f"{path}: {name}.params has setting(s) this library does not implement: {', '.join(unknown)}"
        )
    return {k: v for k, v in params.items() if k in known}


def config_from_yaml(path: str | Path, name: str | None = None) -> Hunyuan3DConfig:
    """Read a released ``config.yaml`` (see the module docstring)."""
    path = Path(path)
    try:
        import yaml
    except ImportError:
        raise ImportError("reading config.yaml needs PyYAML: pip install 'embodied-accel[shape]'") from None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{path}: cannot read it as YAML ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a mapping with model / vae / conditioner sections")
    dit_params = _params(_section(data, "model", path), "model", path, "Hunyuan3DDiT")
    axes = dit_params.get("axes_dim")
    dit = DitConfig(**_pick(dit_params, _DIT_KEYS, _DIT_IGNORED, "model", path))
    if axes is not None and sum(axes) != dit.head_dim:
        raise CheckpointError(f"{path}: model.params.axes_dim {axes} does not sum to the head dim {dit.head_dim}")
    vae = VaeConfig(
        **_pick(_params(_section(data, "vae", path), "vae", path, "ShapeVAE"), _VAE_KEYS, _VAE_IGNORED, "vae", path)
    )
    cond = _params(_section(data, "conditioner", path), "conditioner", path, "SingleImageEncoder")
    encoder = cond.get("main_image_encoder", {})
    if encoder.get("type") != "DinoImageEncoder":
        raise CheckpointError(
            f"{path}: conditioner.main_image_encoder.type is {encoder.get('type')!r}; this library runs "
            "DinoImageEncoder (single-image models; the multi-view 2mv conditioner is not implemented)"
        )
    kwargs: dict[str, Any] = encoder.get("kwargs", {}) or {}
    dino_cfg = kwargs.get("config")
    if not isinstance(dino_cfg, dict):
        raise CheckpointError(f"{path}: conditioner.main_image_encoder.kwargs.config (the DINOv2 config) is missing")
    if dino_cfg.get("model_type", "dinov2") != "dinov2":
        raise CheckpointError(
            f"{path}: the conditioner's model_type is {dino_cfg.get('model_type')!r}, expected dinov2"
        )
    dino = DinoConfig(
        **{ours: dino_cfg[theirs] for theirs, ours in _DINO_RENAMES.items() if theirs in dino_cfg},
        image_size=int(kwargs.get("image_size", 224)),
        use_cls_token=bool(kwargs.get("use_cls_token", True)),
    )
    proc = data.get("image_processor", {}).get("params", {}) or {}
    scheduler = data.get("scheduler", {}) or {}
    scheduler_params = scheduler.get("params", {}) or {}
    target = str(scheduler.get("target", "FlowMatchEulerDiscreteScheduler"))
    if target.endswith("ConsistencyFlowMatchEulerDiscreteScheduler"):
        kind = "consistency"
    elif target.endswith("FlowMatchEulerDiscreteScheduler"):
        kind = "flow_matching"
        if float(scheduler_params.get("shift", 1.0)) != 1.0 or scheduler_params.get("use_dynamic_shifting"):
            raise CheckpointError(f"{path}: scheduler.params shift / use_dynamic_shifting are not implemented")
    else:
        raise CheckpointError(f"{path}: scheduler.target {target!r} is not a flow-matching Euler scheduler")
    config = Hunyuan3DConfig(
        name=name or path.parent.name,
        dit=dit,
        vae=vae,
        dino=dino,
        processor_size=int(proc.get("size", 512)),
        border_ratio=float(proc.get("border_ratio") or 0.15),
        num_train_timesteps=int(scheduler_params.get("num_train_timesteps", 1000)),
        scheduler=kind,
        pcm_timesteps=int(scheduler_params.get("pcm_timesteps", 50)),
        default_steps=5 if kind == "consistency" else 50,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    return config


__all__ = ["PRESETS", "DinoConfig", "DitConfig", "Hunyuan3DConfig", "VaeConfig", "config_from_yaml", "get_preset"]
