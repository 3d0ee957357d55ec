"""Drive ``embodied-accel serve --protocol lerobot-async`` with LeRobot 0.6.1's own client pieces: its generated gRPC
stub (``lerobot.transport.services_pb2_grpc.AsyncInferenceStub``), its channel options and chunked sender
(``lerobot.transport.utils``), its payload dataclasses and robot-feature mapping (``lerobot.async_inference.helpers``),
and ``RobotClient.start`` / ``RobotClient.send_observation`` themselves (on the state they read: a whole RobotClient
needs a robot): Ready, SendPolicyInstructions, SendObservations, then GetActions as ``receive_actions`` calls it.

Run with LeRobot's interpreter:

    python async_client_check.py --server 127.0.0.1:PORT --checkpoint DIR --observation raw.npz --out result.json

``raw.npz`` holds the robot's raw values: one array per motor (``<name>.pos``, a scalar) and per camera (``H, W, 3``
uint8), plus ``task``. A malicious pickle (``os.system``) is sent first and must be refused; the JSON written records
every answer.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import threading
import time
import types
from pathlib import Path

import grpc
import numpy as np
from lerobot.async_inference.helpers import (
    RemotePolicyConfig,
    TimedAction,
    TimedObservation,
    map_robot_keys_to_lerobot_features,
    raw_observation_to_observation,
)
from lerobot.async_inference.robot_client import RobotClient
from lerobot.configs import FeatureType, PolicyFeature
from lerobot.transport import services_pb2, services_pb2_grpc
from lerobot.transport.utils import grpc_channel_options, send_bytes_in_chunks


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _refusal(call) -> dict:
    try:
        call()
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "details": exc.details()}
    return {"code": "OK", "details": ""}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--observation", type=Path, required=True)
    parser.add_argument("--policy-type", default="pi0")
    parser.add_argument("--actions-per-chunk", type=int, default=5)
    parser.add_argument("--rename", default="{}", help="rename_map as JSON")
    parser.add_argument("--marker", type=Path, required=True, help="a file the malicious pickle would create")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prepared", type=Path, help="write LeRobot's server-side observation here (.npz)")
    args = parser.parse_args()

    stored = np.load(args.observation)
    raw = {key: (stored[key].item() if stored[key].ndim == 0 else stored[key]) for key in stored.files}
    raw["task"] = str(raw["task"])
    # a robot's observation_features: float for motors, (H, W, C) for cameras (what LeRobot's robots declare)
    features = {
        key: (value.shape if isinstance(value, np.ndarray) else float) for key, value in raw.items() if key != "task"
    }
    lerobot_features = map_robot_keys_to_lerobot_features(types.SimpleNamespace(observation_features=features))

    channel = grpc.insecure_channel(args.server, grpc_channel_options())
    stub = services_pb2_grpc.AsyncInferenceStub(channel)
    config = RemotePolicyConfig(
        policy_type=args.policy_type,
        pretrained_name_or_path=args.checkpoint,
        lerobot_features=lerobot_features,
        actions_per_chunk=args.actions_per_chunk,
        device="cpu",
        rename_map=json.loads(args.rename),
    )
    # RobotClient's own start() and send_observation(), on the state they read (a RobotClient needs a robot)
    client = types.SimpleNamespace(
        stub=stub, policy_config=config, logger=logging.getLogger("robot_client"),
        shutdown_event=threading.Event(), running=True,
    )  # fmt: skip
    result: dict = {}
    wrong = RemotePolicyConfig("act", args.checkpoint, lerobot_features, args.actions_per_chunk)
    result["wrong_type"] = _refusal(
        lambda: stub.SendPolicyInstructions(services_pb2.PolicySetup(data=pickle.dumps(wrong)))
    )
    result["ready"] = result["instructions"] = RobotClient.start(client)  # Ready, then SendPolicyInstructions

    evil_observation = {"x": _System(f"touch {args.marker}")}
    evil = TimedObservation(timestamp=time.time(), timestep=0, observation=evil_observation)
    result["malicious"] = _refusal(
        lambda: stub.SendObservations(send_bytes_in_chunks(pickle.dumps(evil), services_pb2.Observation))
    )
    result["malicious_sent_by_client"] = RobotClient.send_observation(client, evil)  # False: the server refused it
    result["marker_exists"] = args.marker.exists()

    timestamp = 1000.0
    observation = TimedObservation(timestamp=timestamp, timestep=3, observation=raw, must_go=True)
    result["sent"] = RobotClient.send_observation(client, observation)
    answer = stub.GetActions(services_pb2.Empty())
    actions = pickle.loads(answer.data)  # nosec: the test's own server
    result["actions_types"] = sorted({type(a).__name__ for a in actions})
    result["all_timed_actions"] = all(isinstance(a, TimedAction) for a in actions)
    result["timesteps"] = [a.get_timestep() for a in actions]
    result["timestamps"] = [a.get_timestamp() for a in actions]
    result["actions"] = [a.get_action().tolist() for a in actions]
    result["action_dtype"] = str(actions[0].get_action().dtype)
    result["pickled_observation_bytes"] = len(pickle.dumps(observation))
    channel.close()
    args.out.write_text(json.dumps(result))
    if args.prepared is not None:
        # what LeRobot's own PolicyServer hands its pre-processor for this observation (before renaming): the
        # policy's image shapes from the checkpoint, looked up by the robot's keys as its server does
        inputs = json.loads((Path(args.checkpoint) / "config.json").read_text())["input_features"]
        rename = json.loads(args.rename)
        image_features = {
            key: PolicyFeature(type=FeatureType.VISUAL, shape=tuple(inputs[rename.get(key, key)]["shape"]))
            for key in lerobot_features
            if key.startswith("observation.images.")
        }
        prepared = raw_observation_to_observation(raw, lerobot_features, image_features)
        np.savez(args.prepared, **{key: value.numpy() for key, value in prepared.items() if key != "task"})


if __name__ == "__main__":
    main()
