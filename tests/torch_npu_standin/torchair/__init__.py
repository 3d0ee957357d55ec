"""A CPU stand-in for ``torchair`` (the torch.compile backend torch_npu ships for Ascend graph mode).

It checks and records what the library asks torchair for, and compiles with torch.compile's inductor-free
``eager`` backend instead of Ascend's graph engine. Sources (facts, not code): Ascend/torchair
``python/torchair/__init__.py`` (``CompilerConfig``, ``get_npu_backend(*, compiler_config=None,
custom_decompositions={})``), ``python/torchair/configs/compiler_config.py`` (``mode`` one of
"max-autotune" | "reduce-overhead" | "npugraph_ex"; ``tiling_schedule_optimize`` is among the options that do
not take effect outside "max-autotune") and ``python/torchair/configs/experimental_config.py`` (the
``experimental_config`` options and their allowed values). As in torchair, setting an option that does not
exist or a value outside its allowed list raises.
"""

from __future__ import annotations

import functools

import torch

IS_STANDIN = True


class _Options:
    """A config node: only the declared options can be set, each to one of its allowed values."""

    _allowed: dict[str, tuple] = {}

    def __init__(self, **defaults):
        object.__setattr__(self, "_values", dict(defaults))

    def __getattr__(self, key):
        values = object.__getattribute__(self, "_values")
        if key in values:
            return values[key]
        raise AttributeError(key)

    def __setattr__(self, key, value):
        if key not in self._values:
            raise ValueError(f"{type(self).__name__} has no option {key}, all options {sorted(self._values)}")
        allowed = self._allowed.get(key)
        if allowed is not None and value not in allowed:
            raise ValueError(f"Value {value!r} not in optional list {list(allowed)}")
        self._values[key] = value

    def as_dict(self) -> dict:
        return {k: (v.as_dict() if isinstance(v, _Options) else v) for k, v in self._values.items()}


class _ExperimentalConfig(_Options):
    _allowed = {
        "cc_parallel_enable": (False, True),
        "keep_inference_input_mutations": (True, False),
        "memory_efficiency": (True, False),
        "frozen_parameter": (True, False),
        "npu_fx_pass": (True, False),
        "topology_sorting_strategy": ("BFS", "DFS", "RDFS", "StableRDFS"),
        "enable_ref_data": (True, False),
        "enable_view_optimize": (True, False),
        "remove_noop_ops": (True, False),
        "tiling_schedule_optimize": (True, False),
        "pattern_fusion_pass": (True, False),
    }

    def __init__(self):
        super().__init__(
            cc_parallel_enable=False,
            keep_inference_input_mutations=True,
            memory_efficiency=False,
            frozen_parameter=False,
            npu_fx_pass=False,
            topology_sorting_strategy="DFS",
            enable_ref_data=False,
            enable_view_optimize=True,
            remove_noop_ops=True,
            tiling_schedule_optimize=False,
            pattern_fusion_pass=True,
        )


class CompilerConfig(_Options):
    """``torchair.CompilerConfig`` (the parts the stand-in models)."""

    _allowed = {"mode": ("max-autotune", "reduce-overhead", "npugraph_ex")}

    def __init__(self):
        super().__init__(mode="max-autotune", experimental_config=_ExperimentalConfig())


#: What each get_npu_backend call asked for, and the graphs its backend compiled (for tests).
backend_requests: list[dict] = []
compiled_graphs: list[torch.fx.GraphModule] = []


def _backend(gm: torch.fx.GraphModule, example_inputs, *, compiler_config: CompilerConfig):
    compiled_graphs.append(gm)
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend("eager")(gm, example_inputs)


def get_npu_backend(*, compiler_config: CompilerConfig | None = None, custom_decompositions: dict | None = None):
    """Record the config and return a torch.compile backend (the ``eager`` backend in place of GE)."""
    compiler_config = compiler_config if compiler_config is not None else CompilerConfig()
    if not isinstance(compiler_config, CompilerConfig):
        raise TypeError(f"compiler_config must be a torchair.CompilerConfig, got {type(compiler_config).__name__}")
    backend_requests.append(compiler_config.as_dict())
    return functools.partial(_backend, compiler_config=compiler_config)
