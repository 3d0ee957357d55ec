"""VGGT (Visual Geometry Grounded Transformer): images of a scene → cameras, depth, point maps and tracks."""

from .config import PRESETS, VggtConfig, get_preset

__all__ = ["PRESETS", "VggtConfig", "get_preset"]
