"""How much a hostile message delays the policy server's other clients.

Starts the server in-process on loopback (pi0-tiny by default), measures a normal client's request latency
alone, then again while ``--attackers`` clients each send, over and over, a message of ``--message-mib`` (16 MiB:
the server's default size limit) that decodes to as many objects as msgpack can pack into it: one byte per empty
map. Two shapes are sent in turn: one list of 16.7 million empty maps (``flat``) and lists of as many empty maps
as a list may hold (``nested``: every list within the per-list limit, so only the per-message count stops it). Records the
normal client's latency, how long each hostile message took to be refused, ``GET /healthz`` latency (the event
loop's responsiveness) and the process's resident memory, as a JSON result under ``bench/results/`` stamped with
the device, git sha (``git_dirty``) and date. The attackers run in their own processes (torch-free); the server,
the normal client and the probe share this one.

    python tools/measure_hostile_message.py [--attackers 1 4] [--seconds 10] [--out-dir bench/results]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from embodied_accel.serve import codec
from embodied_accel.serve.client import PolicyClient, http_get
from embodied_accel.serve.loadtest import sample_request
from embodied_accel.serve.metrics import resident_memory_bytes


def expansion_messages(size_bytes: int) -> dict[str, bytes]:
    """Messages of at most ``size_bytes`` that are nearly all empty maps (msgpack ``0x80``, one byte each)."""
    prefix = b"\x81\xa1x"  # {"x": ...}
    flat_count = size_bytes - len(prefix) - 5
    flat = prefix + b"\xdd" + flat_count.to_bytes(4, "big") + b"\x80" * flat_count
    per_list = codec.DEFAULT_LIMITS.max_collection_len
    lists = (size_bytes - len(prefix) - 5) // (5 + per_list)
    inner = b"\xdd" + per_list.to_bytes(4, "big") + b"\x80" * per_list
    nested = prefix + b"\xdd" + lists.to_bytes(4, "big") + inner * lists
    return {"flat": flat, "nested": nested}


def _summary_ms(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"n": 0, "mean_ms": None, "p50_ms": None, "p90_ms": None, "max_ms": None}
    ms = np.asarray(seconds) * 1e3
    return {
        "n": int(ms.size),
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "max_ms": float(ms.max()),
    }


def _normal_latencies(client: PolicyClient, observation: dict[str, Any], seconds: float) -> list[float]:
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        client.infer(observation)
        latencies.append(time.perf_counter() - start)
    return latencies


def _attacker(url: str, messages: dict[str, bytes], index: int, stop: Any, results: Any) -> None:
    """One hostile client (its own process, so that it does not share the server's GIL): sends the messages in
    turn until ``stop``; puts ``(name, seconds to the refusal or None if answered, error kind)`` on ``results``."""
    from websockets.sync.client import connect

    names = list(messages)
    ws = None
    i = index
    try:
        while not stop.is_set():
            if ws is None:  # error messages keep the connection; a server without them closes it after each
                ws = connect(f"{url}/?{codec.ERROR_FRAMES_PARAM}=1", compression=None, max_size=None).__enter__()
                ws.recv()  # metadata
            name = names[i % len(names)]
            i += 1
            start = time.perf_counter()
            ws.send(messages[name])
            reply = ws.recv(timeout=600)
            elapsed = time.perf_counter() - start
            if isinstance(reply, str):  # openpi's refusal: text, then close
                results.put((name, elapsed, reply.split(" ", 1)[0]))
                ws.close()
                ws = None
                continue
            decoded = codec.unpackb(reply, "reply")
            kind = decoded["error"]["kind"] if "error" in decoded else None
            results.put((name, elapsed if kind else None, kind))
    finally:
        if ws is not None:
            ws.close()


def _probe_healthz(url: str, stop: threading.Event, latencies: list[float]) -> None:
    """The event loop's responsiveness: GET /healthz every 50 ms."""
    while not stop.is_set():
        start = time.perf_counter()
        http_get(url, "/healthz", timeout_s=60)
        latencies.append(time.perf_counter() - start)
        time.sleep(0.05)


def measure(url: str, attackers: int, seconds: float, messages: dict[str, bytes], observation: dict) -> dict:
    """The normal client's latency while ``attackers`` clients send the hostile messages in turn."""
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    processes = [context.Process(target=_attacker, args=(url, messages, i, stop, results)) for i in range(attackers)]
    probe_stop, healthz = threading.Event(), []
    rss_mb: list[float] = []

    def sample_rss() -> None:
        while not probe_stop.is_set():
            rss = resident_memory_bytes()
            if rss is not None:
                rss_mb.append(rss / 2**20)
            time.sleep(0.1)

    threads = [
        threading.Thread(target=_probe_healthz, args=(url, probe_stop, healthz)),
        threading.Thread(target=sample_rss),
    ]
    rss_before = resident_memory_bytes()
    for process in processes:
        process.start()
    with PolicyClient(url) as client:
        first = time.monotonic()
        while results.empty() and time.monotonic() - first < 120:  # the attack is under way
            time.sleep(0.05)
        for thread in threads:
            thread.start()
        latencies = _normal_latencies(client, observation, seconds)
    stop.set()
    probe_stop.set()
    for thread in threads:
        thread.join()
    outcomes = []
    while any(process.is_alive() for process in processes) or not results.empty():
        try:
            outcomes.append(results.get(timeout=1))
        except queue.Empty:
            pass
    for process in processes:
        process.join()
    refusals = {name: [t for n, t, kind in outcomes if n == name and t is not None] for name in messages}
    return {
        "attackers": attackers,
        "normal_latency": _summary_ms(latencies),
        "healthz_latency": _summary_ms(healthz),
        "refusal_latency": {name: _summary_ms(values) for name, values in refusals.items()},
        "hostile_messages_refused": sum(len(v) for v in refusals.values()),
        "refusal_kinds": sorted({kind for _, t, kind in outcomes if t is not None}),
        "hostile_messages_answered": sum(1 for _, t, _ in outcomes if t is None),
        "rss_before_mb": rss_before / 2**20 if rss_before is not None else None,
        "rss_peak_mb": max(rss_mb) if rss_mb else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="pi0-tiny")
    parser.add_argument("--num-steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--attackers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--seconds", type=float, default=10.0, help="normal requests per phase, in seconds")
    parser.add_argument("--message-mib", type=float, default=16.0)
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    import torch  # the server's side only: the attacker processes import this module without torch

    from embodied_accel import load_policy
    from embodied_accel.bench import harness
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    load_at_start = os.getloadavg()[0]
    torch.set_num_threads(1)
    logging.getLogger("embodied_accel").setLevel(logging.ERROR)  # one refusal per hostile message is expected
    policy = load_policy(args.model, progress=False)
    size = int(args.message_mib * 2**20)
    messages = expansion_messages(size)
    config = ServeConfig(host="127.0.0.1", port=0, num_steps=args.num_steps, max_message_bytes=size)
    with ServerThread(PolicyServer(policy, config)) as running:
        observation = sample_request(running.server.metadata)
        with PolicyClient(running.url) as client:
            client.infer(observation)  # warm-up
            baseline = _summary_ms(_normal_latencies(client, observation, args.seconds))
        phases = [measure(running.url, n, args.seconds, messages, observation) for n in args.attackers]

    env = harness.environment_stamp()
    meta = running.server.metadata
    record = {
        "kind": "hostile_message",
        "model": meta.get("family"),
        "preset": meta.get("model"),
        "device": env["device"],
        "backend": meta.get("backend"),
        "capture": meta.get("capture"),
        "dtype": meta.get("dtype"),
        "steps": meta.get("num_steps"),
        "message_bytes": {name: len(message) for name, message in messages.items()},
        "decode_limits": {
            "max_collection_len": codec.DEFAULT_LIMITS.max_collection_len,
            "max_items": codec.DEFAULT_LIMITS.max_items,
        },
        "seconds_per_phase": args.seconds,
        "baseline_normal_latency": baseline,
        "phases": phases,
        "versions": env["versions"],
        "git_sha": env["git_sha"],
        "git_dirty": env["git_dirty"],
        "date": env["date"],
        "cpu_count": env["cpu_count"],
        "threads": env["threads"],
        "load_average_1min": {"start": load_at_start, "end": os.getloadavg()[0]},  # other jobs on the machine
    }
    stamp = record["date"].replace("-", "").replace(":", "").split("+")[0]
    device = "".join(c if c.isalnum() else "-" for c in env["device"].lower())[:48].strip("-")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"{stamp}Z_hostile_message_{record['preset']}_{device}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"baseline": baseline, "phases": phases}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
