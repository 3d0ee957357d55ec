"""pi0 and pi0.5 (Physical Intelligence's flow-matching VLA policies), one implementation for both."""

from .config import PRESETS, GemmaConfig, Pi0Config, SiglipConfig, get_preset

__all__ = ["PRESETS", "GemmaConfig", "Pi0Config", "SiglipConfig", "get_preset"]
