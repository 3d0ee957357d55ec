"""GR00T N1.6 (NVIDIA Isaac GR00T): Eagle backbone (SigLIP2 + Qwen3) and a flow-matching DiT action head."""

from .config import PRESETS, GrootConfig, get_preset

__all__ = ["PRESETS", "GrootConfig", "get_preset"]
