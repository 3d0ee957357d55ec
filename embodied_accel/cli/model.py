"""``run``, ``info``, ``bench`` and ``profile``: the commands every model family shares, through the family registry
(:mod:`embodied_accel.families`): the model ``--model`` / ``--checkpoint`` names is loaded by its family, which gives
the call to run or measure; these commands print, time, count and write the same result fields for all of them."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..families import CLIError, LoadedModel, family_of, load_model
from ..families.policy import DEFAULT_MODEL
from ..ops import fallbacks
from ..progress import counter, show_progress, working
from ..runtime.threads import choose_cpu_threads

logger = logging.getLogger(__name__)

PROG = "embodied-accel"
#: The options only the policies read (flag, attribute, value when not given).
POLICY_ONLY_OPTIONS = (("--embodiment", "embodiment", None), ("--backbone-config", "backbone_config", None),
                       ("--vl-padding", "vl_padding", None),
                       ("--tokenizer", "tokenizer", None), ("--cuda-attention", "cuda_attention", "sdpa"),
                       ("--rtc-schedule", "rtc_schedule", None), ("--rtc-max-guidance", "rtc_max_guidance", None),
                       ("--rtc-execution-horizon", "rtc_execution_horizon", None),
                       ("--observation", "observation", None), ("--noise", "noise", None),
                       ("--output", "output", None))  # fmt: skip


def _human_count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


#: What the first call of a captured mode does before it runs (it is silent otherwise, for up to a minute).
FIRST_CALL_WORK = {
    "compile": "compiling the call for this shape with torch.compile (first call only; this can take a minute)",
    "cudagraph": "capturing the call for this shape as a CUDA graph (first call only)",
    "compile+cudagraph": "compiling the call for this shape and capturing it as a CUDA graph (first call only; this "
    "can take a minute)",
    "torchair": "compiling the call for this shape with torchair (first call only; this can take minutes)",
}


def _say(args: argparse.Namespace, message: str) -> None:
    """A progress line of the command on stderr (stdout keeps the results)."""
    print(f"{PROG} {args.command}: {message}", file=sys.stderr, flush=True)


def _announce_first_call(args: argparse.Namespace, model: LoadedModel) -> None:
    work = FIRST_CALL_WORK.get(model.capture)
    if work is not None:
        _say(args, work + " ...")


def _load(args: argparse.Namespace) -> LoadedModel:
    """The model ``--model`` / ``--checkpoint`` names, through its family (options of other families refused)."""
    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_MODEL)
    loaded_family = family_of(source).name
    if loaded_family not in ("pi0", "groot"):
        for flag, dest, unset in POLICY_ONLY_OPTIONS:
            if getattr(args, dest, unset) != unset:
                raise CLIError(f"{flag} applies to policies (pi0 / pi0.5 / GR00T); {source} is a {loaded_family} "
                               "model")  # fmt: skip
    if args.checkpoint is not None:  # a checkpoint's loader draws its own bar
        model = load_model(source, args)
    else:
        with working(f"{PROG} {args.command}: building {source} with seeded random weights", _progress(args)):
            model = load_model(source, args)
    model.threads_line = choose_cpu_threads(model.device, model.num_parameters(), getattr(args, "threads", None))
    return model


def cmd_run(args: argparse.Namespace) -> int:
    model = _load(args)
    _announce_first_call(args, model)
    lines = model.run(args)
    if model.random_weights:
        print(model.random_weights_notice())
    print("\n".join(lines))
    if model.threads_line is not None:
        print(model.threads_line)
    return 0


def _fallback_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} {n} call(s)" for op, n in counts.items()) or "none"


def cmd_info(args: argparse.Namespace) -> int:
    model = _load(args)
    ops, n = model.ops, model.num_parameters()
    if model.random_weights:
        print(model.random_weights_notice())
    print(f"model:       {model.source_line()}")
    print(f"weights:     {'RANDOM (seeded), not trained' if model.random_weights else 'loaded from the checkpoint'}")
    print(f"parameters:  {_human_count(n)} ({n:,})")
    print(f"runtime:     backend {model.backend_label}, capture {model.capture}, dtype {model.dtype_name}, "
          f"device {model.device}")  # fmt: skip
    if model.threads_line is not None:
        print(model.threads_line)
    if ops.fused or ops.fallback:
        print(f"fused ops:   {', '.join(ops.fused) or 'none'}")
        print(f"fallback:    {', '.join(ops.fallback) or 'none'} (pure-PyTorch reference)")
        for op, note in ops.notes.items():
            print(f"  {op + ':':<24}{note}")
        print(f"reference fallbacks of fused ops so far: {_fallback_text(fallbacks.counts())} (each logged once; "
              "bench records count those of their calls)")  # fmt: skip
    else:
        print("fused ops:   none (every op is the pure-PyTorch reference)")
    for line in model.info_lines():
        print(line)
    print(f"load time:   {model.load_seconds:.2f} s")
    return 0


def aten_op_counts(model: LoadedModel, call, progress: bool = False) -> tuple[int, str, int]:
    """The aten ops of one call of ``call`` as ``bench`` records and ``profile`` reports them: ``(count, method,
    profiler's top-level count)``. Eager calls count every dispatched op (a dispatch mode); captured calls what the
    profiler sees (a dispatch mode makes torch.compile skip its frames). ``progress``: a bar over these calls."""
    from ..bench import harness

    eager = model.capture == "eager"
    with counter("counting aten ops", 2 if eager else 1, progress, unit="call") as bar:
        profiled = harness.count_profiled_aten_ops(call)
        bar.update()
        if eager:
            counted = harness.count_aten_ops(call)[1]
            bar.update()
            return counted, "dispatch_mode", profiled
    return profiled, "profiler_top_level", profiled


def _backend_slug(model: LoadedModel) -> str:
    return model.ops.backend + ("-triton-attention" if model.ops.settings.get("cuda_attention") == "triton" else "")


def cmd_profile(args: argparse.Namespace) -> int:
    from ..bench import profiler

    no_chart = profiler.chart_support()
    if no_chart is not None:  # said before the work, and again with the files
        _say(args, f"no chart: {no_chart}; the summary and the trace are written")
    model = _load(args)
    measured = model.measured_call(args)
    name = (f"{model.preset}_{_backend_slug(model)}_{model.capture}_{model.dtype_name}_b{measured.batch}"
            f"_v{measured.views}")  # fmt: skip
    out_dir = args.out_dir / name
    _announce_first_call(args, model)
    _say(args, f"{args.warmup} unprofiled call(s), then {args.calls} under the profiler ...")
    summary = profiler.profile_calls(measured.call, calls=args.calls, warmup=args.warmup,
                                     trace_path=out_dir / "trace.json")  # fmt: skip
    _say(args, "counting the aten ops of one call (as bench does; each counting call is slower than a timed one) ...")
    summary.aten_ops_per_call, summary.aten_ops_method, _ = aten_op_counts(model, measured.call, _progress(args))
    print(summary.format())
    (out_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    chart = profiler.plot_summary(summary, out_dir / "breakdown.png", name) if no_chart is None else None
    print(
        f"wrote {out_dir / 'trace.json'} (chrome://tracing), {out_dir / 'summary.json'}"
        + (f", {chart}" if chart else f"; no chart: {no_chart}")
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .. import platform as platform_mod
    from ..bench import harness

    model = _load(args)
    plat = platform_mod.detect()
    progress = _progress(args)
    measured = model.measured_call(args)
    call = measured.call

    plat.reset_peak_memory()
    first_call_ms = None
    before = fallbacks.counts()  # reference fallbacks of the measured calls (a CUDA graph: of its capture)
    _announce_first_call(args, model)  # with --warmup 0 the first timed run compiles
    if args.warmup:  # the first call apart: compile / capture / allocator warm-up show here, not in the mean
        _say(args, "first call (warm-up, timed apart) ...")
        first_call = harness.time_calls(call, warmup=0, runs=1, synchronize=plat.synchronize, progress=False)
        first_call_ms = first_call[0] * 1e3
    warmup_left = max(args.warmup - 1, 0)
    _say(args, f"{warmup_left} more warm-up call(s), then {args.runs} timed runs ...")
    times = harness.time_calls(call, warmup=warmup_left, runs=args.runs, synchronize=plat.synchronize,
                               progress=progress)  # fmt: skip
    peak_mem_mb = plat.peak_memory_mb()
    reference_fallbacks = fallbacks.since(before)
    mean_s = sum(times) / len(times)
    _say(args, f"counting the aten ops of one call ({'two calls' if model.capture == 'eager' else 'one call'}, each "
               f"slower than a timed one's {mean_s:.2g} s) ...")  # fmt: skip
    aten_ops, aten_ops_method, profiled_aten_ops = aten_op_counts(model, call, progress)
    if plat.device_type == "cuda":  # kernel launches and busy time exist only on the GPU
        _say(args, "device activity of one call (profiler) ...")
    kernel_launches, busy = harness.device_activity(call, plat)
    end_to_end_runs = max(args.runs // 4, 1)
    end_to_end_p50_ms = None
    if measured.end_to_end is not None:
        _say(args, f"end to end: {end_to_end_runs} run(s) from observation dicts (+ host validation, tokenization) ...")
        end_to_end = harness.time_calls(measured.end_to_end, warmup=1, runs=end_to_end_runs,
                                        synchronize=plat.synchronize, progress=progress, desc="end to end")  # fmt: skip
        end_to_end_p50_ms = harness.summarize(end_to_end)["p50_ms"]

    stages: dict[str, Any] = {}
    if measured.stage_fns is not None and not args.no_stages:
        if model.capture != "eager":
            logger.warning("bench: the per-stage split runs eager stages; skipped for capture %s", model.capture)
        else:
            stage_fns = measured.stage_fns()
            _say(args, f"per-stage split ({', '.join(stage_fns)}), {args.runs} timed runs each ...")
            stages = stage_split(stage_fns, args.warmup, args.runs, plat, progress)

    record = harness.result_record(
        model=model.family, preset=model.preset, backend=model.ops.backend, capture=model.capture,
        dtype=model.dtype_name, batch=measured.batch, views=measured.views, steps=measured.steps, times=times,
        aten_ops_per_call=aten_ops, peak_mem_mb=peak_mem_mb, peak_mem_kind=plat.peak_memory_kind,
        kernel_launches_per_call=kernel_launches, device_busy_fraction=busy, plat=plat, source=model.source,
        random_weights=model.random_weights, num_parameters=model.num_parameters(), warmup=args.warmup,
        first_call_ms=first_call_ms, capture_s=model.capture_seconds, end_to_end_p50_ms=end_to_end_p50_ms,
        measured_call=measured.description, aten_ops_method=aten_ops_method,
        profiled_aten_ops_per_call=profiled_aten_ops, load_s=model.load_seconds, note=args.note,
        fused_ops=list(model.ops.fused), fallback_ops=list(model.ops.fallback),
        **fallbacks.record_fields(reference_fallbacks), **measured.fields, **stages,
    )  # fmt: skip
    path = harness.write_result(record, args.out_dir)
    print(_bench_line(record))
    if first_call_ms is not None:
        capture = f", incl. {record['capture_s']:.1f} s of graph capture" if record.get("capture_s") else ""
        print(f"first call: {first_call_ms:.1f} ms (warm-up{capture}; not in the mean)")
    if end_to_end_p50_ms is not None:
        print(f"end to end: p50 {end_to_end_p50_ms:.2f} ms over {end_to_end_runs} runs (observation dicts in: "
              "+ host validation, tokenization and packing)")  # fmt: skip
    if model.ops.fused:
        print(f"ops: fused {', '.join(model.ops.fused)}; reference {', '.join(model.ops.fallback) or 'none'}")
        print(f"reference fallbacks of fused ops: {_fallback_text(reference_fallbacks)}")
    if stages:
        print("stages: " + ", ".join(f"{k[6:-3]} {v:.2f} ms" for k, v in stages.items() if k.endswith("_ms")))
    if model.threads_line is not None:
        print(model.threads_line)
    print(f"wrote {path}")
    return 0


def stage_split(stage_fns: dict[str, Any], warmup: int, runs: int, plat, progress: bool) -> dict[str, Any]:
    """Mean time and aten ops of each stage (``stage_fns``: name -> callable, run eagerly apart)."""
    from ..bench import harness

    stages: dict[str, Any] = {}
    for name, fn in stage_fns.items():
        stage_times = harness.time_calls(
            fn, warmup=warmup, runs=runs, synchronize=plat.synchronize, progress=progress, desc=name
        )
        stages[f"stage_{name}_ms"] = harness.summarize(stage_times)["mean_ms"]
        stages[f"stage_{name}_aten_ops"] = harness.count_aten_ops(fn)[1]
    return stages


def _progress(args: argparse.Namespace) -> bool:
    """Progress bars only on an interactive terminal, unless --no-progress."""
    return show_progress(args.no_progress)


def _bench_line(r: dict[str, Any]) -> str:
    line = (
        f"{r['model']}/{r['preset']} {r['backend']}{_attention_suffix(r)} {r['capture']} {r['dtype']} b{r['batch']} "
        f"v{r['views']} "
        f"{r['steps']} steps on {r['device']}: mean {r['mean_ms']:.2f} ms, p50 {r['p50_ms']:.2f}, "
        f"p90 {r['p90_ms']:.2f} over {r['runs']} runs; {r['aten_ops_per_call']} aten ops/call"
    )
    if r["kernel_launches_per_call"] is not None:
        line += f", {r['kernel_launches_per_call']} kernels/call, device busy {r['device_busy_fraction']:.0%}"
    return line + f"; peak {r['peak_mem_mb']:.0f} MB"


def _attention_suffix(record: dict[str, Any]) -> str:
    attention = record.get("cuda_attention")
    return f" (attention {attention})" if attention else ""
