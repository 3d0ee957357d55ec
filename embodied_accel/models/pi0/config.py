"""Architecture configs and named presets for pi0 and pi0.5.

Architecture (widths, depths, heads) lives here as frozen dataclasses; runtime knobs (backend,
dtype, number of denoising steps per call) are arguments of ``load_policy`` / ``sample_actions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ...nn.gemma import GemmaConfig
from ...nn.siglip import SiglipConfig

Family = Literal["pi0", "pi05"]


GEMMA_2B = GemmaConfig(width=2048, depth=18, mlp_dim=16384)
GEMMA_300M = GemmaConfig(width=1024, depth=18, mlp_dim=4096)


@dataclass(frozen=True)
class Pi0Config:
    """pi0 / pi0.5: SigLIP + Gemma VLM prefix, Gemma action expert, flow-matching sampler."""

    name: str
    family: Family
    vision: SiglipConfig = field(default_factory=SiglipConfig)
    vlm: GemmaConfig = GEMMA_2B
    expert: GemmaConfig = GEMMA_300M
    vocab_size: int = 257152
    action_horizon: int = 50  # LeRobot's chunk_size
    max_state_dim: int = 32
    max_action_dim: int = 32
    max_token_len: int = 48  # pi0: 48, pi0.5: 200 (LeRobot's tokenizer_max_length)
    num_steps: int = 10  # default denoising steps per call
    min_period: float = 4e-3
    max_period: float = 4.0

    @property
    def has_state_token(self) -> bool:
        """pi0 feeds the state as a suffix token; pi0.5 writes it into the prompt."""
        return self.family == "pi0"

    @property
    def adaptive_expert_norms(self) -> bool:
        """pi0.5 conditions the expert's RMSNorms on the flow-matching time (adaRMS)."""
        return self.family == "pi05"

    def validate(self) -> None:
        """Raise ValueError if the two towers cannot share attention."""
        vlm, exp = self.vlm, self.expert
        for field_name in ("depth", "num_kv_heads", "head_dim", "num_heads"):
            if getattr(vlm, field_name) != getattr(exp, field_name):
                raise ValueError(
                    f"{self.name}: vlm.{field_name}={getattr(vlm, field_name)} but "
                    f"expert.{field_name}={getattr(exp, field_name)}; the action expert reads the VLM's K/V "
                    "layer by layer, so depth, heads, KV heads and head_dim must match"
                )
        if vlm.num_heads % vlm.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")


_TINY_VISION = SiglipConfig(width=64, depth=2, num_heads=4, mlp_dim=128)
_TINY_VLM = GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
_TINY_EXPERT = GemmaConfig(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=16)

PRESETS: dict[str, Pi0Config] = {
    "pi0": Pi0Config(name="pi0", family="pi0"),
    "pi05": Pi0Config(name="pi05", family="pi05", max_token_len=200),
    # The reduced configs of the LeRobot parity fixtures (tests/fixtures/pi0*_tiny).
    "pi0-tiny": Pi0Config(
        name="pi0-tiny", family="pi0", vision=_TINY_VISION, vlm=_TINY_VLM, expert=_TINY_EXPERT, vocab_size=1024
    ),
    "pi05-tiny": Pi0Config(
        name="pi05-tiny",
        family="pi05",
        vision=_TINY_VISION,
        vlm=_TINY_VLM,
        expert=_TINY_EXPERT,
        vocab_size=1024,
        max_token_len=200,
    ),
}

#: LeRobot's ``paligemma_variant`` / ``action_expert_variant`` names.
GEMMA_VARIANTS: dict[str, GemmaConfig] = {"gemma_2b": GEMMA_2B, "gemma_300m": GEMMA_300M}


def get_preset(name: str) -> Pi0Config:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def with_overrides(config: Pi0Config, **changes) -> Pi0Config:
    """A copy of ``config`` with some fields replaced (validated)."""
    new = replace(config, **changes)
    new.validate()
    return new
