#!/usr/bin/env python
"""Drive the LeRobot plugin (``lerobot_policy_embodied_accel``) with LeRobot 0.6.1's own classes and tools.

Run with a Python that has ``lerobot==0.6.1``, ``embodied-accel`` and the plugin installed (``.ci/run`` builds
``.venv-lerobot``; ``tests/test_lerobot_plugin.py`` runs each subcommand and reads the JSON it writes)::

    V/bin/python tools/lerobot_reference/plugin_checks.py parity pusht-checkpoint async errors --work DIR

Each check runs in this one process (LeRobot is imported once) and works under ``DIR/<check>``; the results go to
``DIR/checks.json``.

``parity``: LeRobot's ``PI0Policy`` / ``PI05Policy`` (tiny, with make_fixtures.py's in-process patches) and ours
(``--policy.type`` embodied_pi0 / embodied_pi05, from a policy directory written by the plugin's wrap tool) load the
same committed fixture checkpoint (``tests/fixtures/{pi0,pi05}_tiny``) and its saved LeRobot processors; one raw
observation batch goes through LeRobot's pre-processor, both policies' ``predict_action_chunk`` (same noise) and
``select_action`` (noise drawn by each policy from the same seed) and LeRobot's post-processor.

``pusht-checkpoint``: a tiny random pi0 / pi0.5 saved LeRobot's way (``save_pretrained`` of the policy and of its
pre- and post-processors) with PushT's features, and the plugin's policy directory for it, for ``lerobot-eval``.

``async``: LeRobot's own async-inference server on a free loopback port, driven through its own gRPC stubs:
``Ready``, ``SendPolicyInstructions`` for our policy type (``--policy-dir``, default PushT's pi0), ``Ready``.

``errors``: the messages for a directory that is not a pi0 / pi0.5 checkpoint, a policy directory of the other type,
and a missing checkpoint.

The tokenizer is a local Hugging Face tokenizer built from embodied_accel's bundled tiny SentencePiece model (the
PaliGemma tokenizer the checkpoints name is gated on the hub); the processors are pointed at it through LeRobot's
processor overrides, or, for ``lerobot-eval``, in the saved ``policy_preprocessor.json``.
"""

from __future__ import annotations

import argparse
import json
import pickle  # the async-inference protocol's own payload format (LeRobot's client pickles its requests)
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

torch.set_num_threads(1)

import make_fixtures as mf  # noqa: E402  (LeRobot's modules, and the tiny-size patches)

FIXTURES = REPO / "tests" / "fixtures"
TOKENIZER_MODEL = REPO / "embodied_accel" / "data" / "tiny_tokenizer.model"
TASKS = ["pick up the red block", "open the drawer"]
STEPS_COMPARED = 3  # select_action calls compared per policy


def install_tiny_patches() -> None:
    """make_fixtures.py's tiny architecture patches, with transformers' real AutoTokenizer kept (a local one is used)."""
    import transformers
    from lerobot.processor import tokenizer_processor

    mf.install_patches()
    tokenizer_processor.AutoTokenizer = transformers.AutoTokenizer


def make_tokenizer(directory: Path) -> Path:
    """A Hugging Face Gemma tokenizer directory converted from the bundled tiny SentencePiece model (ids < 1024)."""
    import shutil

    from transformers import AutoTokenizer

    source = directory / "sentencepiece"
    source.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TOKENIZER_MODEL, source / "tokenizer.model")
    (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GemmaTokenizer"}))
    AutoTokenizer.from_pretrained(source).save_pretrained(directory)
    return directory


def wrap(source: Path, destination: Path) -> Path:
    from lerobot_policy_embodied_accel.wrap import wrap_checkpoint

    return wrap_checkpoint(source, destination, backend="reference", overwrite=True)


def processors(config, directory: Path, tokenizer_dir: Path):
    from lerobot.policies.factory import make_pre_post_processors

    return make_pre_post_processors(
        config, pretrained_path=str(directory),
        preprocessor_overrides={"tokenizer_processor": {"tokenizer_name": str(tokenizer_dir)}},
    )  # fmt: skip


def raw_observation(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    batch = {
        f"observation.images.{camera}": torch.rand(mf.BATCH, 3, *mf.RAW_HW, generator=gen)
        for camera in mf.PRESENT_CAMERAS
    }  # right_wrist_0_rgb missing: a -1 image with mask False in both policies
    batch["observation.state"] = torch.randn(mf.BATCH, mf.STATE_DIM, generator=gen) * 0.5
    batch["task"] = list(TASKS)
    return batch


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max |theirs|."""
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-12))


def parity(work: Path) -> dict:
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    from lerobot_policy_embodied_accel.modeling_embodied_pi0 import EmbodiedPi0Policy
    from lerobot_policy_embodied_accel.modeling_embodied_pi05 import EmbodiedPi05Policy

    install_tiny_patches()
    tokenizer_dir = make_tokenizer(work / "tokenizer")
    results = {}
    for kind, theirs_cls, ours_cls in (("pi0", PI0Policy, EmbodiedPi0Policy), ("pi05", PI05Policy, EmbodiedPi05Policy)):
        checkpoint = FIXTURES / f"{kind}_tiny"
        theirs = theirs_cls.from_pretrained(str(checkpoint), strict=True).eval()
        policy_dir = wrap(checkpoint, work / f"{kind}_embodied")
        ours = ours_cls.from_pretrained(str(policy_dir))
        pre, post = processors(theirs.config, checkpoint, tokenizer_dir)
        ours_pre, ours_post = processors(ours.config, policy_dir, tokenizer_dir)
        batch, ours_batch = pre(raw_observation(7)), ours_pre(raw_observation(7))
        same_batch = all(
            torch.equal(batch[key], ours_batch[key]) for key in batch if isinstance(batch[key], torch.Tensor)
        )
        noise = torch.randn(mf.BATCH, 50, 32, generator=torch.Generator().manual_seed(11))
        with torch.no_grad():
            theirs_chunk = theirs.predict_action_chunk(batch, noise=noise.clone())
            ours_chunk = ours.predict_action_chunk(ours_batch, noise=noise.clone())
        theirs_actions, ours_actions = post(theirs_chunk), ours_post(ours_chunk)
        steps = []
        for policy in (theirs, ours):
            policy.reset()
            torch.manual_seed(1234)
            steps.append([post(policy.select_action(batch)) for _ in range(STEPS_COMPARED)])
        ours.reset()
        torch.manual_seed(1234)
        after_reset = post(ours.select_action(batch))
        results[kind] = {
            "type": ours.config.type,
            "engine": type(ours.engine).__module__,
            "chunk_shape": list(ours_actions.shape),
            "same_preprocessed_batch": same_batch,
            "tokens_valid": ours_batch["observation.language.attention_mask"].sum(1).tolist(),
            "chunk_relative_error": relative_error(ours_actions, theirs_actions),
            "chunk_max_abs_diff": float((ours_actions - theirs_actions).abs().max()),
            "select_action_shape": list(steps[1][0].shape),
            "select_action_relative_error": max(relative_error(o, t) for o, t in zip(steps[1], steps[0], strict=True)),
            "select_action_steps_differ": not torch.equal(steps[1][0], steps[1][1]),
            "reset_restarts_chunk": torch.equal(after_reset, steps[1][0]),
            "actions_abs_max": float(theirs_actions.abs().max()),
        }
    return results


def pusht_checkpoint(work: Path) -> dict:
    """Tiny pi0 / pi0.5 with PushT's features, saved LeRobot's way, and our policy directories for them."""
    import transformers
    from lerobot.processor import tokenizer_processor

    mf.install_patches()  # LeRobot's TokenizerProcessorStep would fetch PaliGemma's tokenizer while building
    try:
        return _pusht_checkpoints(work, make_tokenizer(work / "tokenizer"))
    finally:
        tokenizer_processor.AutoTokenizer = transformers.AutoTokenizer


def _pusht_checkpoints(work: Path, tokenizer_dir: Path) -> dict:
    from lerobot.configs.types import FeatureType
    from lerobot.envs.configs import PushtEnv
    from lerobot.envs.utils import env_to_policy_features
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from lerobot.policies.pi0.processor_pi0 import make_pi0_pre_post_processors
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors

    features = env_to_policy_features(PushtEnv())
    inputs = {k: f for k, f in features.items() if f.type is not FeatureType.ACTION}
    outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
    gen = torch.Generator().manual_seed(5)
    # PushT's positions are pixels in [0, 512]: every statistic either normalization mode reads
    pixel_stats = {"mean": 256.0, "std": 100.0, "q01": 20.0, "q99": 490.0, "min": 0.0, "max": 512.0}
    stats = {key: {name: torch.full((2,), value) for name, value in pixel_stats.items()}
             for key in ("observation.state", "action")}  # fmt: skip
    made = {}
    for kind, policy_cls, make_processors in (
        ("pi0", PI0Policy, make_pi0_pre_post_processors),
        ("pi05", PI05Policy, make_pi05_pre_post_processors),
    ):
        config = mf.make_config(kind)
        config.input_features = dict(inputs)
        config.output_features = dict(outputs)
        config.n_action_steps = 10
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        policy = policy_cls(config).eval()
        mf.randomize_(policy.model, seed=int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        directory = work / f"pusht_{kind}"
        policy.save_pretrained(directory)
        pre, post = make_processors(config, dataset_stats=stats)
        pre.save_pretrained(directory)
        post.save_pretrained(directory)
        preprocessor_json = directory / "policy_preprocessor.json"
        saved = json.loads(preprocessor_json.read_text())
        for step in saved["steps"]:
            if step.get("registry_name") == "tokenizer_processor":
                step["config"]["tokenizer_name"] = str(tokenizer_dir)
        preprocessor_json.write_text(json.dumps(saved, indent=4))
        made[kind] = {"checkpoint": str(directory), "policy_dir": str(wrap(directory, work / f"pusht_{kind}_embodied"))}
    return made


def async_round(work: Path, policy_dir: Path) -> dict:
    """LeRobot's policy server in this process, driven through LeRobot's own gRPC stubs over loopback (its log
    file goes to ``work/logs``)."""
    import os
    from concurrent import futures

    import grpc
    import lerobot_policy_embodied_accel  # noqa: F401  (registers the types, as LeRobot's tools do)
    from lerobot.async_inference.configs import PolicyServerConfig
    from lerobot.async_inference.helpers import RemotePolicyConfig
    from lerobot.transport import services_pb2, services_pb2_grpc

    config = PolicyServerConfig(host="127.0.0.1", port=8080, fps=30, inference_latency=0.0, obs_queue_timeout=1.0)
    previous = os.getcwd()
    os.chdir(work)  # importing the server opens logs/policy_server_<time>.log under the working directory
    try:
        from lerobot.async_inference.policy_server import PolicyServer

        service = PolicyServer(config)
    finally:
        os.chdir(previous)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    services_pb2_grpc.add_AsyncInferenceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")  # a free loopback port (the config's port is not used here)
    server.start()
    result: dict = {}
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = services_pb2_grpc.AsyncInferenceStub(channel)
        stub.Ready(services_pb2.Empty(), timeout=10)
        result["ready"] = True
        features = json.loads((policy_dir / "config.json").read_text())["input_features"]
        specs = RemotePolicyConfig(
            policy_type="embodied_pi0", pretrained_name_or_path=str(policy_dir), lerobot_features=features,
            actions_per_chunk=10, device="cpu",
        )  # fmt: skip
        try:
            stub.SendPolicyInstructions(services_pb2.PolicySetup(data=pickle.dumps(specs)), timeout=30)
            result["send_policy_instructions"] = "accepted"
        except grpc.RpcError as exc:
            result["send_policy_instructions"] = "refused"
            result["status"] = exc.code().name
            result["details"] = exc.details()
        stub.Ready(services_pb2.Empty(), timeout=10)
        result["ready_after"] = True
        channel.close()
    finally:
        server.stop(grace=1)
    return result


def errors(work: Path) -> dict:
    """What a user gets for a wrong directory or a missing checkpoint: one error naming the file or field."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot_policy_embodied_accel.modeling_embodied_pi0 import EmbodiedPi0Policy
    from lerobot_policy_embodied_accel.wrap import main as wrap_main

    found = {}
    act = work / "act_checkpoint"
    act.mkdir(parents=True, exist_ok=True)
    (act / "config.json").write_text(json.dumps({"type": "act"}))
    found["wrap_exit_code"] = wrap_main([str(act), str(work / "out")])
    pi05_dir = wrap(FIXTURES / "pi05_tiny", work / "pi05_embodied")
    try:
        EmbodiedPi0Policy.from_pretrained(str(pi05_dir))
    except ValueError as exc:
        found["wrong_type"] = str(exc)
    config = PreTrainedConfig.from_pretrained(wrap(FIXTURES / "pi0_tiny", work / "pi0_embodied"))
    config.checkpoint = None
    try:
        EmbodiedPi0Policy(config)
    except ValueError as exc:
        found["no_checkpoint"] = str(exc)
    config.checkpoint = str(work / "missing")
    try:
        EmbodiedPi0Policy(config)
    except ValueError as exc:
        found["missing_checkpoint"] = str(exc)
    return found


CHECKS = ("parity", "pusht-checkpoint", "async", "errors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checks", nargs="+", choices=CHECKS, help="what to run, in one process (LeRobot imports once)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--policy-dir", type=Path, help="async: the policy directory to request (default: PushT's pi0)")
    args = parser.parse_args()
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for check in args.checks:
        work = args.work / check
        work.mkdir(exist_ok=True)
        if check == "parity":
            results[check] = parity(work)
        elif check == "pusht-checkpoint":
            results[check] = pusht_checkpoint(work)
        elif check == "errors":
            results[check] = errors(work)
        else:
            policy_dir = args.policy_dir or Path(
                results.get("pusht-checkpoint", {}).get("pi0", {}).get("policy_dir", "")
            )
            if not (policy_dir / "config.json").is_file():
                parser.error("async: pass --policy-dir, or run pusht-checkpoint first")
            results[check] = async_round(work, policy_dir)
    (args.work / "checks.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
