"""Datasets and bundled sample inputs.

This package holds the library's bundled files (``sample_observation.npz``, the tiny presets' ``tiny_tokenizer.model``)
and the LeRobot dataset reader (:mod:`.lerobot_dataset`, pyarrow + PyAV: the ``[train]`` extra), its writer
(:mod:`.writer`) and the training samples built on it (:mod:`.samples`). Nothing heavy is imported here.
"""
