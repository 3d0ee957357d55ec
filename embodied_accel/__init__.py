"""embodied_accel: fast, checked inference for embodied-AI models (pi0, pi0.5, GR00T N1.6, ...).

>>> from embodied_accel import load_policy
>>> policy = load_policy("pi0-tiny")            # a preset with seeded random weights
>>> policy = load_policy("/path/to/lerobot_pi0") # a LeRobot checkpoint directory
>>> policy.infer(observation)["actions"]        # [horizon, action_dim]
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_policy(preset_or_checkpoint: str, **kwargs):
    """Load a policy from a preset name or a checkpoint directory of any model family (recognized from the name
    or the directory; see :mod:`embodied_accel.policies`). For pi0 / pi0.5 see
    :func:`policies.pi0.load_pi0_policy`.

    Keyword arguments: ``backend`` (auto|reference|cuda|npu), ``dtype`` (float32|bfloat16), ``device``,
    ``seed`` (random-weight presets), ``preset`` (architecture of a small custom checkpoint),
    ``tokenizer`` (SentencePiece file), ``num_views``, ``capture`` (eager|compile|cudagraph|torchair), ``progress``
    (default False: ``True`` shows a progress bar on stderr while a checkpoint's weights load; off by default so that
    notebooks and logs get none unasked), ``cuda_attention`` (sdpa|triton: the cuda backend's attention kernel).
    GR00T N1.6 (presets ``groot-n1.6``, ``groot-tiny`` or a checkpoint directory, see
    :func:`policies.groot.load_groot_policy`) also takes ``embodiment`` (the embodiment tag) and reads ``tokenizer``
    as an Isaac-GR00T checkout or its tokenizer dir.
    """
    from .policies import load_policy as load_any

    return load_any(preset_or_checkpoint, **{"progress": False, **kwargs})


__all__ = ["__version__", "load_policy"]
