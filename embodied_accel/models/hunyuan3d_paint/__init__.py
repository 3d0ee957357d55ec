"""Hunyuan3D-Paint 2.0 texture models (delight, multiview diffusion): config, model, weights, schedulers, images."""
