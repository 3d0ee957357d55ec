"""Mesh geometry on tensors, shared by the model families: rasterization, camera maps, UV unwrapping, texture baking
and inpainting."""
