"""Architecture configs and named presets for pi0 and pi0.5.

Architecture (widths, depths, heads) lives here as frozen dataclasses; runtime knobs (backend,
dtype, number of denoising steps per call) are arguments of ``load_policy`` / ``sample_actions``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from ...nn.gemma import GemmaConfig
from ...nn.siglip import SiglipConfig

logger = logging.getLogger(__name__)

Family = Literal["pi0", "pi05"]

#: Where the library's bundled files live (the tiny presets' tokenizer, the sample observation).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"


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
    #: A SentencePiece file in ``embodied_accel/data`` for presets without a trained vocabulary (the tiny ones); a
    #: preset with PaliGemma's vocabulary, and every checkpoint, uses the PaliGemma tokenizer instead.
    bundled_tokenizer: str | None = None

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


#: The tiny presets' tokenizer (``tools/make_tiny_tokenizer.py``): English robot instructions, 1024 pieces.
TINY_TOKENIZER_FILE = "tiny_tokenizer.model"
_TINY_VISION = SiglipConfig(width=64, depth=2, num_heads=4, mlp_dim=128)
_TINY_VLM = GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
_TINY_EXPERT = GemmaConfig(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=16)

PRESETS: dict[str, Pi0Config] = {
    "pi0": Pi0Config(name="pi0", family="pi0"),
    "pi05": Pi0Config(name="pi05", family="pi05", max_token_len=200),
    # The reduced configs of the LeRobot parity fixtures (tests/fixtures/pi0*_tiny).
    "pi0-tiny": Pi0Config(
        name="pi0-tiny",
        family="pi0",
        vision=_TINY_VISION,
        vlm=_TINY_VLM,
        expert=_TINY_EXPERT,
        vocab_size=1024,
        bundled_tokenizer=TINY_TOKENIZER_FILE,
    ),
    "pi05-tiny": Pi0Config(
        name="pi05-tiny",
        family="pi05",
        vision=_TINY_VISION,
        vlm=_TINY_VLM,
        expert=_TINY_EXPERT,
        vocab_size=1024,
        max_token_len=200,
        bundled_tokenizer=TINY_TOKENIZER_FILE,
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


# ---------------------------------------------------------------------------------------------------------------
# Size: parameters and the memory their weights take
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParameterCount:
    """The parameters of a config, and how many of them stay float32 in every compute dtype."""

    total: int
    kept_fp32: int  # vision tower, projector, norms and the small action/state/time projections (LeRobot's choice)


def parameter_count(config: Pi0Config) -> ParameterCount:
    """The number of parameters a model of ``config`` loads (the unused ``lm_head`` matrices not counted)."""
    v = config.vision
    w, m = v.width, v.mlp_dim
    vision = w * 3 * v.patch_size**2 + w + v.num_patches * w + 2 * w  # patch embedding, positions, final norm
    vision += v.depth * (3 * w * w + 3 * w + w * w + w + 4 * w + 2 * w * m + m + w)  # qkv, out, 2 norms, MLP
    projector = w * config.vlm.width + config.vlm.width
    kept, matrices = vision + projector, config.vocab_size * config.vlm.width  # the embedding follows the dtype
    for tower, adaptive in ((config.vlm, False), (config.expert, config.adaptive_expert_norms)):
        d, hd = tower.width, tower.head_dim
        attention = d * (tower.num_heads + 2 * tower.num_kv_heads) * hd + tower.num_heads * hd * d
        matrices += tower.depth * (attention + 3 * d * tower.mlp_dim)
        norm = 3 * d * d + 3 * d if adaptive else d  # adaRMS: a dense [d, 3d] + bias; else the scale
        kept += (2 * tower.depth + 1) * norm
    de, na, ns = config.expert.width, config.max_action_dim, config.max_state_dim
    heads = [(na, de), (de, na)]  # action in / out
    heads += [(ns, de), (2 * de, de), (de, de)] if config.has_state_token else [(de, de), (de, de)]
    kept += sum(fan_in * fan_out + fan_out for fan_in, fan_out in heads)
    return ParameterCount(total=kept + matrices, kept_fp32=kept)


def weight_bytes(config: Pi0Config, dtype: torch.dtype) -> int:
    """Bytes the weights of ``config`` take in compute dtype ``dtype`` (the fp32-kept parts at 4 bytes)."""
    count = parameter_count(config)
    return count.kept_fp32 * 4 + (count.total - count.kept_fp32) * dtype.itemsize


def available_host_memory_bytes() -> int | None:
    """The memory this machine can give a new process without swapping (Linux ``MemAvailable``), or None when the
    system does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def report_memory_need(config: Pi0Config, dtype: torch.dtype, device: torch.device | str) -> int:
    """Say (INFO) how much memory the weights of ``config`` in ``dtype`` take, before anything is built, and warn
    when they go to host memory (``device`` is the CPU) and exceed what the machine has available. Returns the
    estimate in bytes."""
    device = torch.device(device)
    count = parameter_count(config)
    need = weight_bytes(config, dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    available = available_host_memory_bytes() if device.type == "cpu" else None
    logger.info(
        "%s: %.2f M parameters, about %s of weights in %s on %s%s",
        config.name, count.total / 1e6, _gib(need), dtype_name, device,
        f" ({_gib(available)} of host memory available)" if available is not None else "",
    )  # fmt: skip
    if available is not None and need > available:
        hints = (
            [f"--dtype bfloat16 needs about {_gib(weight_bytes(config, torch.bfloat16))}"] if dtype.itemsize > 2 else []
        )
        if need > 2**30:
            hints.append("a tiny preset such as pi0-tiny needs about 1 MiB")
        logger.warning(
            "%s in %s needs about %s of memory for its weights alone, more than the %s this machine has available: "
            "loading will likely fail or swap%s",
            config.name, dtype_name, _gib(need), _gib(available), f" ({'; '.join(hints)})" if hints else "",
        )  # fmt: skip
    return need
