"""Hunyuan3D-2 shape generation (image → 3-D mesh): config, model, weights, sampler, volume decoding, meshes."""
