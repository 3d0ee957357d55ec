"""Policy server and client speaking openpi's websocket protocol (msgpack with numpy arrays).

    embodied-accel serve --model pi0-tiny --port 8000          # server (needs torch)
    from embodied_accel.serve.client import PolicyClient       # robot side: numpy, msgpack, websockets only

Modules: :mod:`.codec` (wire format), :mod:`.keymap` (openpi LIBERO / ALOHA / DROID keys → model keys),
:mod:`.metrics` (Prometheus text, JSON log lines), :mod:`.batching` (request queue, one inference thread),
:mod:`.config` and :mod:`.server`, :mod:`.client` (client helper and asynchronous action-chunk executor),
:mod:`.loadtest` (the ``serve`` and ``loadtest`` commands are in :mod:`embodied_accel.cli.serve`).

Importing this package imports nothing heavy; the names below load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PolicyServer": ".server",
    "ServeConfig": ".server",
    "ServerThread": ".server",
    "PolicyClient": ".client",
    "ServerError": ".client",
    "RequestRefused": ".client",
    "ActionChunkExecutor": ".client",
    "ExecutorReset": ".client",
    "KeyMap": ".keymap",
    "WireError": ".codec",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = sorted(_EXPORTS)
