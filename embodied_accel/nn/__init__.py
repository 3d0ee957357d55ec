"""Blocks shared by models, built only from ops: Gemma decoder layers, the SigLIP encoder, a static KV cache."""
