"""Ready-to-run pipelines of model families that are not robot policies (Hunyuan3D-2: image → mesh)."""
