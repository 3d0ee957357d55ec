"""The DiT feature cache: FBCache, TeaCache and TaylorSeer for any DiT that declares a plan of its blocks.

>>> cached = CachedDiT(plan, load_cache_config("taylorseer.json"))
>>> session = cached.begin(num_steps)              # one per generation; state per CFG stream
>>> v = cached(x, ctx, step)                       # instead of the model's step
>>> session.report.summary()                       # steps computed vs reused, estimated time saved
"""

from .calibrate import SignalRecorder, fit_coefficients, fit_quality
from .config import (
    METHODS,
    CacheConfig,
    CacheConfigError,
    cache_config_from_dict,
    load_cache_config,
    save_cache_config,
)
from .dit_cache import CachedDiT, CacheReport, CacheSession, DiTCachePlan, rel_l1

__all__ = [
    "METHODS",
    "CacheConfig",
    "CacheConfigError",
    "CacheReport",
    "CacheSession",
    "CachedDiT",
    "DiTCachePlan",
    "SignalRecorder",
    "cache_config_from_dict",
    "fit_coefficients",
    "fit_quality",
    "load_cache_config",
    "rel_l1",
    "save_cache_config",
]
