"""Isaac-GR00T's own ``PolicyClient`` (from a checkout) against ``embodied-accel serve --protocol gr00t``.

NOT run by CI (Isaac-GR00T is not on PyPI). Run it with a Python that has the client's own dependencies (msgpack,
msgpack-numpy, pyzmq, numpy; no torch: the checkout's ``gr00t.policy.server_client`` is imported without the
package ``__init__`` files that import the model code):

    python3 -m venv C && C/bin/pip install msgpack==1.1.0 msgpack-numpy==0.4.8 pyzmq numpy
    ISAAC_GROOT=/path/to/Isaac-GR00T C/bin/python tools/groot_reference/client_against_serve.py \
        --serve ".venv/bin/embodied-accel serve --model groot-tiny --protocol gr00t --port 5599 --noise-seed 0"

It starts the server command, waits for ``ping``, then checks what a robot program relies on: the modality configs
come back as the client's ``ModalityConfig``; ``get_action`` on a flat batch of 2 answers float32 arrays
``[2, T, D]`` per action key, T the advertised action steps; the same batch nested (as ``Gr00tPolicy`` takes it)
answers the same numbers under the bare keys; a wrong state width raises the client's ``RuntimeError`` naming the
field, and the next call is served; ``reset`` answers ``{}``. Prints one JSON line and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import subprocess
import sys
import time
import types

import numpy as np


def load_client_module(checkout: str):
    """``gr00t.policy.server_client`` from ``checkout``, its parent packages registered bare (their ``__init__``
    files import torch and the model code, which the client does not use)."""
    for name in ("gr00t", "gr00t.policy", "gr00t.data", "gr00t.configs", "gr00t.configs.data"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(checkout, *name.split("."))]
        sys.modules.setdefault(name, package)
    return importlib.import_module("gr00t.policy.server_client")


def observation(modalities: dict, state_dims: dict[str, int], batch: int, flat: bool) -> dict:
    """A batch in the advertised keys, with as many time steps as each modality's ``delta_indices``."""
    rng = np.random.default_rng(0)
    frames, states = len(modalities["video"].delta_indices), len(modalities["state"].delta_indices)
    video = {key: rng.integers(0, 256, (batch, frames, 64, 64, 3), dtype=np.uint8)
             for key in modalities["video"].modality_keys}  # fmt: skip
    state = {key: rng.uniform(-0.5, 0.5, (batch, states, state_dims[key])).astype(np.float32)
             for key in modalities["state"].modality_keys}  # fmt: skip
    language_key = modalities["language"].modality_keys[0]
    prompts = [[f"pick up block {i}"] for i in range(batch)]
    if not flat:
        return {"video": video, "state": state, "language": {language_key: prompts}}
    return {**{f"video.{k}": v for k, v in video.items()}, **{f"state.{k}": v for k, v in state.items()},
            language_key: prompts}  # fmt: skip


def run_checks(client_module, host: str, port: int, state_dims: dict[str, int]) -> dict:
    client = client_module.PolicyClient(host=host, port=port, timeout_ms=60000)
    results: dict = {"ping": client.ping()}
    modalities = client.get_modality_config()
    config_class = client_module.ModalityConfig
    results["modality_configs"] = {name: type(value).__name__ for name, value in modalities.items()}
    assert all(isinstance(value, config_class) for value in modalities.values()), results["modality_configs"]
    steps = len(modalities["action"].delta_indices)

    flat_actions, info = client.get_action(observation(modalities, state_dims, 2, flat=True))
    results["flat"] = {key: [str(value.dtype), list(value.shape)] for key, value in flat_actions.items()}
    assert set(flat_actions) == {f"action.{key}" for key in modalities["action"].modality_keys}, results["flat"]
    for value in flat_actions.values():
        assert isinstance(value, np.ndarray) and value.dtype == np.float32, type(value)
        assert value.shape[:2] == (2, steps) and np.isfinite(value).all(), value.shape
    results["server_timing"] = info.get("server_timing")

    nested_actions, _ = client.get_action(observation(modalities, state_dims, 2, flat=False))
    assert set(nested_actions) == set(modalities["action"].modality_keys), sorted(nested_actions)
    results["nested_equals_flat"] = all(
        np.array_equal(nested_actions[key], flat_actions[f"action.{key}"]) for key in nested_actions
    )
    assert results["nested_equals_flat"]

    wrong = observation(modalities, {key: dim + 1 for key, dim in state_dims.items()}, 1, flat=True)
    try:
        client.get_action(wrong)
    except RuntimeError as exc:
        results["refusal"] = str(exc)
    assert "state." in results.get("refusal", ""), results.get("refusal")
    results["ping_after_refusal"] = client.ping()
    results["reset"] = client.reset()
    assert results["ping_after_refusal"] and results["reset"] == {}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", required=True, help="the server command (it must serve --protocol gr00t)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5599, help="the port the server command binds")
    parser.add_argument("--state-dims", default="arm=7,gripper=1", help="width of each state key (groot-tiny's)")
    parser.add_argument("--startup-s", type=float, default=300.0, help="longest wait for the server's first ping")
    args = parser.parse_args()
    checkout = os.environ.get("ISAAC_GROOT")
    if not checkout:
        sys.exit("set ISAAC_GROOT to an Isaac-GR00T checkout (its gr00t/policy/server_client.py is the client)")
    state_dims = {key: int(dim) for key, dim in (part.split("=") for part in args.state_dims.split(","))}
    client_module = load_client_module(checkout)

    server = subprocess.Popen(shlex.split(args.serve), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + args.startup_s
        probe = client_module.PolicyClient(host=args.host, port=args.port, timeout_ms=2000)
        while not probe.ping():
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the server did not answer ping: {server.stderr.read()[-2000:] if server.stderr else ''}")
            time.sleep(0.5)
        results = run_checks(client_module, args.host, args.port, state_dims)
    finally:
        server.terminate()
        server.wait(30)
    serializer = "msgpack-numpy" if "msgpack_numpy" in sys.modules else ".npy"
    print(json.dumps({"client": os.path.join(checkout, "gr00t/policy/server_client.py"), "arrays": serializer,
                      "ok": True, **results}))  # fmt: skip


if __name__ == "__main__":
    main()
