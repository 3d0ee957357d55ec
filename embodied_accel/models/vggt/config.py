"""Architecture configs and named presets for VGGT (Visual Geometry Grounded Transformer), as frozen dataclasses;
runtime knobs (backend, dtype, frame chunking, sequence parallelism, quantization) belong to the loader and forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...nn.dpt import DptConfig
from ...nn.vit import VitBlockConfig


@dataclass(frozen=True)
class PatchEmbedConfig:
    """The DINOv2 ViT with registers that turns each frame into patch tokens (``vit_large`` in VGGT-1B)."""

    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4
    pretrain_image_size: int = 518  # its position embedding's grid: pretrain_image_size // patch_size squared
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class CameraHeadConfig:
    trunk_depth: int = 4
    num_heads: int = 16
    mlp_ratio: float = 4.0
    iterations: int = 4
    pose_dim: int = 9  # absT_quaR_FoV: translation 3, quaternion (xyzw) 4, field of view (h, w) 2


@dataclass(frozen=True)
class TrackHeadConfig:
    features: int = 128
    iterations: int = 4
    stride: int = 2
    corr_levels: int = 7
    corr_radius: int = 4
    hidden_size: int = 384
    depth: int = 6  # time blocks (and space blocks) of the update transformer
    num_heads: int = 8
    num_virtual_tracks: int = 64
    max_scale: float = 518.0
    mlp_ratio: float = 4.0


@dataclass(frozen=True)
class VggtConfig:
    """VGGT: DINOv2 patch embedding, alternating frame / global attention, camera / depth / point / track heads."""

    name: str
    image_size: int = 518
    patch_size: int = 14
    width: int = 1024  # embed_dim
    depth: int = 24  # frame blocks = global blocks
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4
    rope_frequency: float = 100.0
    patch_embed: PatchEmbedConfig = field(default_factory=PatchEmbedConfig)
    camera: CameraHeadConfig = field(default_factory=CameraHeadConfig)
    dpt_features: int = 256
    dpt_out_channels: tuple[int, int, int, int] = (256, 512, 1024, 1024)
    dpt_layers: tuple[int, int, int, int] = (4, 11, 17, 23)
    track: TrackHeadConfig = field(default_factory=TrackHeadConfig)
    enable_camera: bool = True
    enable_depth: bool = True
    enable_point: bool = True
    enable_track: bool = True

    # ---- derived -------------------------------------------------------------------------------------------
    @property
    def patch_start(self) -> int:
        """Index of the first patch token of a frame: 1 camera token + registers come first."""
        return 1 + self.num_register_tokens

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    def aggregator_block(self) -> VitBlockConfig:
        return VitBlockConfig(self.width, self.num_heads, self.mlp_ratio, qk_norm=True, layerscale=True, norm_eps=1e-5)

    def patch_embed_block(self) -> VitBlockConfig:
        pe = self.patch_embed
        return VitBlockConfig(
            self.width, pe.num_heads, pe.mlp_ratio, qk_norm=False, layerscale=True, norm_eps=pe.norm_eps
        )

    def camera_block(self) -> VitBlockConfig:
        c = self.camera
        return VitBlockConfig(2 * self.width, c.num_heads, c.mlp_ratio, qk_norm=False, layerscale=True, norm_eps=1e-5)

    def dpt(self, **changes) -> DptConfig:
        base = DptConfig(
            dim_in=2 * self.width,
            patch_size=self.patch_size,
            features=self.dpt_features,
            out_channels=self.dpt_out_channels,
            layers=self.dpt_layers,
        )
        return replace(base, **changes)

    def point_dpt(self) -> DptConfig:
        return self.dpt(output_dim=4, activation="inv_log", conf_activation="expp1")

    def depth_dpt(self) -> DptConfig:
        return self.dpt(output_dim=2, activation="exp", conf_activation="expp1")

    def track_dpt(self) -> DptConfig:
        return self.dpt(features=self.track.features, feature_only=True, down_ratio=2, pos_embed=False)

    @property
    def dense_layers(self) -> tuple[int, ...]:
        """Aggregator layers whose patch tokens a head reads (the DPT heads and the tracker's feature extractor)."""
        if self.enable_depth or self.enable_point or self.enable_track:
            return tuple(sorted(set(self.dpt_layers)))
        return ()

    @property
    def kept_layers(self) -> tuple[int, ...]:
        """Aggregator layers whose outputs a head reads (the others are never stored)."""
        layers = set()
        if self.enable_depth or self.enable_point or self.enable_track:
            layers.update(self.dpt_layers)
        if self.enable_camera:
            layers.add(self.depth - 1)
        return tuple(sorted(layers))

    def validate(self) -> None:
        if self.width % self.num_heads or self.head_dim % 4:
            raise ValueError(f"{self.name}: width {self.width} / heads {self.num_heads} must give a head dim divisible "
                             "by 4 (2-D RoPE)")  # fmt: skip
        if any(not 0 <= i < self.depth for i in self.dpt_layers):
            raise ValueError(f"{self.name}: dpt_layers {self.dpt_layers} outside 0..{self.depth - 1}")
        for block in (self.aggregator_block(), self.patch_embed_block(), self.camera_block()):
            block.validate()
        if self.track.hidden_size % self.track.num_heads:
            raise ValueError(f"{self.name}: track hidden_size must be a multiple of its num_heads")


PRESETS: dict[str, VggtConfig] = {
    "vggt": VggtConfig(name="vggt"),
    # The reduced config of the parity fixture (tests/fixtures/vggt_tiny, tools/vggt_reference/make_fixtures.py).
    "vggt-tiny": VggtConfig(
        name="vggt-tiny",
        image_size=56,
        width=32,
        depth=5,
        num_heads=4,
        patch_embed=PatchEmbedConfig(depth=2, num_heads=4, pretrain_image_size=56),
        camera=CameraHeadConfig(trunk_depth=1, num_heads=4),
        dpt_features=8,
        dpt_out_channels=(8, 16, 32, 32),
        dpt_layers=(1, 2, 3, 4),
        track=TrackHeadConfig(features=8, iterations=2, corr_levels=3, corr_radius=2, hidden_size=32, depth=2),
    ),
}


def get_preset(name: str) -> VggtConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown VGGT preset {name!r}; known presets: {', '.join(PRESETS)}") from None
