"""The ``embodied-accel serve`` and ``embodied-accel loadtest`` commands (options and bodies; cli.py wires them)."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..argtypes import RESULTS_DIR, non_negative_float, positive_float, positive_int
from ..serve.config import API_KEY_ENV, GR00T_PORT, LEROBOT_ASYNC_PORT, PROTOCOLS, ServeConfig
from ..serve.keymap import KEYMAP_CHOICES, can_tokenize_text

logger = logging.getLogger(__name__)

#: The packages of the ``[serve]`` extra (the server, its client and the load test need both).
SERVE_EXTRA_MODULES = ("websockets", "msgpack")


def require_serve_extra(command: str) -> None:
    """Raise ImportError naming ``pip install 'embodied-accel[serve]'`` if a package of the extra is missing."""
    missing = []
    for module in SERVE_EXTRA_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(
            f"embodied-accel {command} needs the [serve] extra ({', '.join(missing)} is not installed): "
            "pip install 'embodied-accel[serve]'"
        )


def _token_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        ids = ()
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids (ints >= 0) such as 2,7,9, got {text!r}")
    return ids


def _protocols(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if (
        not names or len(set(names)) != len(names) or not set(names) <= set(PROTOCOLS)
        or ("lerobot-async" in names and len(names) > 1)
    ):  # fmt: skip
        raise argparse.ArgumentTypeError(
            f"expected {', '.join(PROTOCOLS)}, or openpi,gr00t (both from one process; lerobot-async is served "
            f"alone), got {text!r}"
        )
    return names


def add_server_options(parser: argparse.ArgumentParser, *, network: bool) -> None:
    """Batching and model-call options (both commands); ``network``: also where and how to listen (serve)."""
    group = parser.add_argument_group("server")
    if network:
        group.add_argument(
            "--host",
            default=ServeConfig.host,
            help=f"interface to listen on (default: {ServeConfig.host}, this machine only; 0.0.0.0: every interface, "
            "for robots on the network: give an --api-key too)",
        )
        group.add_argument(
            "--protocol",
            type=_protocols,
            default=("openpi",),
            metavar="P",
            help="openpi (websocket, openpi-client), gr00t (ZeroMQ, Isaac-GR00T's PolicyClient) or openpi,gr00t "
            "(both from one process, one model and one batch queue), or lerobot-async (gRPC, LeRobot's "
            "async-inference robot_client; needs --trusted-network) (default: openpi)",
        )
        group.add_argument(
            "--trusted-network",
            action="store_true",
            help="allow --protocol lerobot-async, whose messages are Python pickles (loaded by an allow-list "
            "unpickler, but a pickle protocol is only as safe as the network): every client must be trusted",
        )
        group.add_argument(
            "--fps",
            type=positive_int,
            default=ServeConfig.lerobot_fps,
            help="lerobot-async: the robot's control rate; a chunk's actions are timestamped 1/fps apart, as "
            f"LeRobot's policy server does with its --fps (default: {ServeConfig.lerobot_fps})",
        )
        group.add_argument(
            "--port",
            type=int,
            help="port (default: 8000 for openpi; with --protocol gr00t alone, the GR00T port, default "
            f"{GR00T_PORT}; with lerobot-async, {LEROBOT_ASYNC_PORT}; 0: any free port)",
        )
        group.add_argument(
            "--gr00t-port",
            type=int,
            help=f"the GR00T protocol's port when both protocols are served (default: {GR00T_PORT})",
        )
        group.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="with --protocol gr00t alone: serve GET /healthz and /metrics on this port (with openpi they are on "
            "--port)",
        )
        group.add_argument(
            "--allow-remote-kill",
            action="store_true",
            help="GR00T's 'kill' endpoint shuts the server down (gracefully); refused otherwise",
        )
        group.add_argument(
            "--api-key",
            metavar="KEY",
            help=f"require this key on every websocket handshake ('Authorization: Api-Key KEY', what openpi-client "
            f"sends with api_key=); default: ${API_KEY_ENV} if set, else no key",
        )
        group.add_argument(
            "--allow-origin",
            action="append",
            default=[],
            metavar="ORIGIN",
            help="a browser origin (e.g. https://lab.example) whose pages may connect; repeatable. Handshakes with "
            "an Origin header (browser pages) are refused otherwise; robots and openpi-client send none",
        )
        group.add_argument(
            "--metrics-need-key", action="store_true", help="GET /metrics also needs the API key (/healthz never)"
        )
        group.add_argument(
            "--max-connections",
            type=positive_int,
            default=ServeConfig.max_connections,
            help=f"open websocket connections; more are refused with HTTP 503 (default: {ServeConfig.max_connections})",
        )
        group.add_argument(
            "--max-inflight-per-connection",
            type=positive_int,
            default=ServeConfig.max_inflight_per_connection,
            metavar="N",
            help="requests one connection (a GR00T client: one ZeroMQ identity) may have in the server; a websocket "
            f"connection is not read beyond them, a GR00T request is refused (default: "
            f"{ServeConfig.max_inflight_per_connection})",
        )
        group.add_argument(
            "--max-buffered-bytes",
            type=positive_int,
            default=ServeConfig.max_buffered_bytes,
            help="received, unanswered bytes all connections may hold beyond one message each; a connection waits "
            f"for room before it receives more (default: {ServeConfig.max_buffered_bytes})",
        )
        group.add_argument(
            "--paced-byte-rate",
            type=positive_float,
            default=ServeConfig.paced_byte_rate,
            metavar="B/S",
            help="messages over --large-message-bytes, and those of a connection sending more than "
            "--connection-byte-rate, are decoded one at a time, connections in turn, at this many bytes/s in all: "
            "receiving bytes costs the server CPU time the model then waits for "
            f"(default: {ServeConfig.paced_byte_rate:.0f})",
        )
        group.add_argument(
            "--large-message-bytes",
            type=positive_int,
            default=ServeConfig.large_message_bytes,
            help=f"see --paced-byte-rate (default: {ServeConfig.large_message_bytes})",
        )
        group.add_argument(
            "--connection-byte-rate",
            type=positive_float,
            default=ServeConfig.connection_byte_rate,
            metavar="B/S",
            help=f"see --paced-byte-rate (default: {ServeConfig.connection_byte_rate:.0f})",
        )
        group.add_argument(
            "--max-observation-keys",
            type=positive_int,
            default=ServeConfig.max_observation_keys,
            help=f"keys one observation may have (default: {ServeConfig.max_observation_keys})",
        )
        group.add_argument(
            "--strict-keys",
            action="store_true",
            help="refuse observations with keys the model does not use (default: answer them, with 'warnings')",
        )
        group.add_argument(
            "--unhealthy-after",
            type=positive_int,
            default=ServeConfig.unhealthy_after,
            metavar="N",
            help="GET /healthz answers 503 after N requests in a row failed inside the model call (e.g. a failed "
            f"device), so a supervisor restarts the server (default: {ServeConfig.unhealthy_after})",
        )
        group.add_argument(
            "--max-message-bytes",
            type=positive_int,
            default=ServeConfig.max_message_bytes,
            help=f"largest accepted message (default: {ServeConfig.max_message_bytes})",
        )
        group.add_argument(
            "--request-timeout-s",
            type=positive_float,
            default=ServeConfig.request_timeout_s,
            help=f"per-request limit, queue + inference (default: {ServeConfig.request_timeout_s:g})",
        )
        group.add_argument(
            "--keymap",
            default="auto",
            metavar="MAP",
            help=f"observation keys: {', '.join(KEYMAP_CHOICES)} or a JSON file (default: auto, per message)",
        )
        instruction = group.add_mutually_exclusive_group()
        instruction.add_argument(
            "--default-prompt", help="instruction for requests that carry none (needs a tokenizer)"
        )
        instruction.add_argument(
            "--default-token-ids",
            type=_token_ids,
            metavar="IDS",
            help="instruction token ids (e.g. 2,7,9) for requests without token ids when the model has no tokenizer "
            "(their text prompt is not used) or for requests that carry no instruction",
        )
        group.add_argument(
            "--drain-timeout",
            type=positive_float,
            default=ServeConfig.drain_timeout_s,
            metavar="S",
            help="on SIGINT / SIGTERM: seconds to answer the requests in flight and close every connection; "
            f"connections still open then are cut (default: {ServeConfig.drain_timeout_s:g})",
        )
        group.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    group.add_argument(
        "--max-batch", type=positive_int, default=ServeConfig.max_batch, help="requests per model call (default: 8)"
    )
    group.add_argument(
        "--batch-wait-ms",
        type=non_negative_float,
        default=ServeConfig.batch_wait_ms,
        help=f"how long a request may wait for others to batch with (default: {ServeConfig.batch_wait_ms:g})",
    )
    group.add_argument("--num-steps", type=positive_int, metavar="N", help="denoising steps (default: the model's)")
    group.add_argument(
        "--action-horizon",
        type=positive_int,
        metavar="N",
        help="answer the first N steps of each action chunk (default: all the model returns)",
    )
    group.add_argument("--views", type=positive_int, metavar="N", help="number of camera slots (default: the model's)")
    group.add_argument(
        "--noise-seed", type=int, metavar="SEED", help="fixed initial noise: equal observations give equal actions"
    )


def add_loadtest_options(
    parser: argparse.ArgumentParser, positive_int: Callable[[str], int], non_negative_int: Callable[[str], int]
) -> None:
    group = parser.add_argument_group("load")
    group.add_argument("--url", help="server to test, e.g. ws://host:8000 (default: start one on loopback in-process)")
    group.add_argument("--clients", type=positive_int, default=16, help="concurrent connections (default: 16)")
    group.add_argument("--requests", type=positive_int, default=200, help="timed requests per client (default: 200)")
    group.add_argument(
        "--warmup", type=non_negative_int, default=2, help="untimed requests per client first (default: 2)"
    )
    group.add_argument(
        "--timeout-s", type=positive_float, default=120.0, help="per-request client timeout (default: 120)"
    )
    group.add_argument(
        "--api-key", metavar="KEY", help=f"the --url server's API key (default: ${API_KEY_ENV} if set)"
    )
    group.add_argument("--out-dir", type=Path, default=Path(RESULTS_DIR), help=f"default: {RESULTS_DIR}/ (here)")
    group.add_argument("--no-write", action="store_true", help="print only, write no result file")
    group.add_argument("--note", help="free text stored in the result file")


def serve_config(args: argparse.Namespace, **overrides: Any) -> ServeConfig:
    fields = {
        "max_batch": args.max_batch,
        "batch_wait_ms": args.batch_wait_ms,
        "num_steps": args.num_steps,
        "noise_seed": args.noise_seed,
    }
    for name in ("host", "max_message_bytes", "request_timeout_s", "keymap", "default_prompt", "action_horizon"):
        if hasattr(args, name):
            fields[name] = getattr(args, name)
    if hasattr(args, "port"):
        protocols = tuple(getattr(args, "protocol", ("openpi",)))
        port, gr00t_port = args.port, getattr(args, "gr00t_port", None)
        if protocols == ("gr00t",):
            if port is not None and gr00t_port is not None and port != gr00t_port:
                raise ValueError(f"--port {port} and --gr00t-port {gr00t_port}: with --protocol gr00t give one")
            gr00t_port = port if port is not None else gr00t_port
        fields.update(
            protocols=protocols,
            port=8000 if port is None else port,
            gr00t_port=GR00T_PORT if gr00t_port is None else gr00t_port,
            allow_remote_kill=getattr(args, "allow_remote_kill", False),
            metrics_port=getattr(args, "metrics_port", None),
            lerobot_port=LEROBOT_ASYNC_PORT if port is None else port,
            trusted_network=getattr(args, "trusted_network", False),
            lerobot_fps=getattr(args, "fps", ServeConfig.lerobot_fps),
        )
    if hasattr(args, "default_token_ids"):
        fields["default_token_ids"] = args.default_token_ids
    if hasattr(args, "drain_timeout"):
        fields["drain_timeout_s"] = args.drain_timeout
    if hasattr(args, "allow_origin"):
        fields.update(api_key=api_key(args), allowed_origins=tuple(args.allow_origin))
    for name in (
        "metrics_need_key", "max_connections", "max_inflight_per_connection", "max_buffered_bytes", "paced_byte_rate",
        "large_message_bytes", "connection_byte_rate", "max_observation_keys", "strict_keys", "unhealthy_after",
    ):  # fmt: skip
        if hasattr(args, name):
            fields[name] = getattr(args, name)
    fields.update(overrides)
    return ServeConfig(**fields)


def api_key(args: argparse.Namespace) -> str | None:
    """``--api-key``, else the environment's, else None."""
    return getattr(args, "api_key", None) or os.environ.get(API_KEY_ENV) or None


def check_instruction_source(policy: Any, config: ServeConfig) -> None:
    """Refuse a server that could not read the instruction of an openpi request (a text ``prompt``): the
    model has no tokenizer and no ``--default-token-ids`` stand in; or ``--default-prompt`` without a tokenizer.
    The fix named is the model family's own tokenizer."""
    if can_tokenize_text(policy):
        return
    model_config = getattr(policy, "config", None)
    name = getattr(model_config, "name", type(policy).__name__)
    if getattr(model_config, "family", None) == "groot":
        fixes = (
            "pass --tokenizer DIR, the GR00T (Eagle) tokenizer: an Isaac-GR00T checkout, or its "
            "gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2 directory (vocab.json, merges.txt, chat_template.json, "
            "tokenizer_config.json or added_tokens.json). --default-token-ids cannot stand in for it: a GR00T "
            "prompt's ids hold one token per image patch, so they fit frames of one size only"
        )
    else:
        fixes = (
            "pass --tokenizer FILE (the PaliGemma tokenizer.model), or --default-token-ids IDS (e.g. 2,7,9: the "
            "instruction of every request that brings no token ids of its own)"
        )
    if config.default_prompt is not None:
        raise ValueError(f"--default-prompt needs a tokenizer, and {name} has none: {fixes}")
    if config.default_token_ids is None:
        raise ValueError(
            f"{name} has no tokenizer, so it cannot read the text prompt that openpi clients send and every such "
            f"request would fail: {fixes}"
        )


def use_json_logs() -> None:
    from ..serve.metrics import JsonFormatter

    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())


def run_serve(load_policy: Callable[[], Any], args: argparse.Namespace, announce: Callable[[str], None]) -> int:
    """Bind the port, then load the policy (``load_policy()``) and serve it until SIGINT / SIGTERM; ``announce``
    gets the listening line and the final "stopped". A port that cannot be bound is an error before the model
    loads."""
    from ..serve.metrics import map_large_allocations
    from ..serve.server import bind_socket

    if args.log_json:
        use_json_logs()
    config = serve_config(args)
    if "lerobot-async" in config.protocols:
        from ..serve.lerobot_async import LeRobotAsyncServer, serve_lerobot_async

        server = LeRobotAsyncServer(config)  # refuses without --trusted-network; binds before the model loads
        return serve_lerobot_async(server, load_policy(), getattr(args, "checkpoint", None), announce)
    map_large_allocations()  # clients' large messages go back to the system when freed (see its docstring)
    sock = gr00t_sock = None
    try:
        if config.http_port is not None:
            try:
                sock = bind_socket(config.host, config.http_port)
            except OSError as exc:
                raise ValueError(f"cannot listen on {config.host}:{config.http_port} ({exc.strerror or exc})") from None
        if "gr00t" in config.protocols:
            from ..serve.gr00t import bind_zmq

            try:
                gr00t_sock = bind_zmq(config.host, config.gr00t_port, config.max_message_bytes)
            except OSError as exc:
                raise ValueError(f"--protocol gr00t: {exc.strerror or exc}") from None
        return _serve_on(sock, gr00t_sock, load_policy(), config, announce)
    finally:
        if sock is not None:
            sock.close()  # no-op once the server has closed it


def _serve_on(
    sock: Any, gr00t_sock: Any, policy: Any, config: ServeConfig, announce: Callable[[str], None]
) -> int:
    import asyncio

    from ..serve.server import PolicyServer

    server = PolicyServer(policy, config, sock=sock, gr00t_sock=gr00t_sock)  # checks the key map
    check_instruction_source(policy, config)
    name = getattr(getattr(policy, "config", None), "name", type(policy).__name__)
    if config.default_token_ids is not None and not can_tokenize_text(policy):
        logger.warning(
            "%s has no tokenizer: text prompts are not used; requests without token ids get --default-token-ids %s",
            name,
            ",".join(map(str, config.default_token_ids)),
        )

    def ready() -> None:
        where = []
        if "openpi" in config.protocols:
            where.append(f"{server.url} (openpi, keymap {server.mapper.name})")
        elif config.http_port is not None:
            where.append(f"{server.url.replace('ws://', 'http://')} (/healthz, /metrics)")
        if server.gr00t is not None:
            where.append(f"{server.gr00t.url} (gr00t)")
        announce(f"serving {name} on {' and '.join(where)}; Ctrl-C stops")

    try:
        asyncio.run(server.run(handle_signals=True, ready=ready))
    except OSError as exc:
        raise ValueError(f"cannot listen on {config.host}:{config.http_port} ({exc.strerror or exc})") from None
    announce("stopped")
    return 0


def run_loadtest_command(
    args: argparse.Namespace, load_policy: Callable[[], Any], observation: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the load test (starting an in-process server unless ``--url``); returns (stats, result record)."""
    from ..progress import counter, show_progress, working
    from ..serve.loadtest import run_loadtest

    progress = show_progress(args.no_progress)
    total = args.clients * (args.warmup + args.requests)
    kwargs = {"clients": args.clients, "requests": args.requests, "warmup": args.warmup, "observation": observation}
    if args.url is not None:
        kwargs["api_key"] = api_key(args)
        try:
            with counter("loadtest requests", total, progress, unit="req") as bar:
                stats = run_loadtest(args.url, timeout_s=args.timeout_s, on_reply=bar.update, **kwargs)
        except OSError as exc:
            raise ValueError(f"--url {args.url}: cannot reach the policy server ({exc})") from None
        return stats, loadtest_record(stats, args, in_process=False)

    from ..serve.server import PolicyServer, ServerThread

    with working("loadtest: building the policy", progress and getattr(args, "checkpoint", None) is None):
        policy = load_policy()
    config = serve_config(args, host="127.0.0.1", port=0)
    with ServerThread(PolicyServer(policy, config)) as running, counter("loadtest requests", total, progress,
                                                                        unit="req") as bar:  # fmt: skip
        stats = run_loadtest(running.url, timeout_s=args.timeout_s, on_reply=bar.update, **kwargs)
    return stats, loadtest_record(stats, args, in_process=True)


def loadtest_record(stats: dict[str, Any], args: argparse.Namespace, *, in_process: bool) -> dict[str, Any]:
    """The flat result record (the bench result keys where they apply, plus the load-test figures)."""
    from ..bench import harness

    meta = stats["metadata"]
    env = harness.environment_stamp()
    device = meta.get("device_name") or (env["device"] if in_process else None)
    record: dict[str, Any] = {
        "kind": "loadtest",
        "model": meta.get("family"),
        "preset": meta.get("model"),
        "device": device or "unknown",
        "backend": meta.get("backend"),
        "capture": meta.get("capture"),
        "dtype": meta.get("dtype"),
        "batch": meta.get("max_batch"),
        "views": len(meta.get("cameras") or []) or None,
        "steps": meta.get("num_steps"),
        "runs": stats["requests"],
        "mean_ms": stats["mean_ms"],
        "p50_ms": stats["p50_ms"],
        "p90_ms": stats["p90_ms"],
        "aten_ops_per_call": None,
        "kernel_launches_per_call": None,
        "device_busy_fraction": None,
        "peak_mem_mb": stats["server_rss_peak_mb"],  # the server's largest sampled RSS
        "versions": env["versions"],
        "git_sha": env["git_sha"],
        "date": env["date"],
    }
    for key in (
        "p99_ms", "min_ms", "max_ms", "throughput_rps", "wall_s", "clients", "requests_per_client",
        "warmup_per_client", "ok", "errors", "error_samples", "model_calls", "mean_batch_size",
        "server_rss_before_mb", "server_rss_final_mb", "server_rss_growth_mb", "server_rss_peak_mb",
        "server_rss_trend_mb", "server_rss_samples",
    ):  # fmt: skip
        record[key] = stats[key]
    record.update(
        server_in_process=in_process,
        url=args.url,
        batch_wait_ms=args.batch_wait_ms if in_process else None,
        keymap=meta.get("keymap"),
        random_weights=meta.get("random_weights"),
        source=meta.get("source"),
        cpu_count=env["cpu_count"],
        threads=env["threads"] if in_process else None,
        git_dirty=env["git_dirty"],
        note=args.note,
    )
    return record


def write_loadtest_record(record: dict[str, Any], out_dir: Path) -> Path:
    """``{date}_loadtest_{preset}_{backend}_{capture}_{dtype}_c{clients}x{requests}_b{batch}_{device}.json``."""

    def slug(value: Any) -> str:
        return re.sub(r"[^a-z0-9.+-]+", "-", str(value).lower()).strip("-.") or "none"

    date = datetime.fromisoformat(record["date"]).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    parts = [record[k] for k in ("preset", "backend", "capture", "dtype")]
    name = "_".join(
        [date, "loadtest", *map(slug, parts), f"c{record['clients']}x{record['requests_per_client']}",
         f"b{record['batch']}", slug(record["device"])[:48].rstrip("-.")]
    )  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    suffix = 2
    while path.exists():
        path = out_dir / f"{name}-{suffix}.json"
        suffix += 1
    path.write_text(json.dumps(record, indent=2, allow_nan=False, default=str) + "\n", encoding="utf-8")
    return path


def loadtest_summary(stats: dict[str, Any], path: Path | None) -> str:
    from ..serve.loadtest import format_summary

    return format_summary(stats) + (f"\nwrote {path}" if path is not None else "")


__all__ = [
    "SERVE_EXTRA_MODULES",
    "add_loadtest_options",
    "api_key",
    "add_server_options",
    "check_instruction_source",
    "loadtest_record",
    "loadtest_summary",
    "require_serve_extra",
    "run_loadtest_command",
    "run_serve",
    "serve_config",
    "write_loadtest_record",
]
