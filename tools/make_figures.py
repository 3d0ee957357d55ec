"""Draw the results figures from the committed benchmark records (``bench/results/*.json``) into ``docs/figures``.

    python tools/make_figures.py              # write docs/figures/*.png and docs/figures/figures.json
    python tools/make_figures.py --check      # verify they are in sync with bench/results (writes nothing)
    python tools/make_figures.py --results DIR --out DIR

Each figure is drawn from data extracted here from the results files; ``figures.json`` holds, per figure, that exact
data, the names of the files it came from and the SHA-256 of its canonical JSON, which is also written into the
PNG's metadata (a ``tEXt`` chunk named ``data-sha256``). PNG pixels depend on the matplotlib and FreeType versions,
so ``--check`` compares data and hashes, not pixels: it needs no matplotlib and fails when a results file was added
or changed without regenerating the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO_ROOT / "bench" / "results"
DEFAULT_OUT = REPO_ROOT / "docs" / "figures"
HASH_KEY = "data-sha256"
INDEX_NAME = "figures.json"
#: The fields that make a flat benchmark record (one measured configuration).
FLAT_FIELDS = ("model", "preset", "device", "backend", "capture", "dtype", "batch", "views", "p50_ms")
CONFIG_FIELDS = FLAT_FIELDS[:-1]
_STAMP = re.compile(r"^(\d{8}T\d{6}Z)_")


# ---------------------------------------------------------------------------------------------------------- data


def _load(results: Path, pattern: str) -> list[tuple[str, dict]]:
    """``(file name, record)`` of the results files matching ``pattern``, oldest first (by the name's time stamp)."""
    files = sorted(results.glob(pattern), key=lambda p: (_stamp(p.name), p.name))
    out = []
    for path in files:
        try:
            out.append((path.name, json.loads(path.read_text(encoding="utf-8"))))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    return out


def _stamp(name: str) -> str:
    match = _STAMP.match(name)
    return match.group(1) if match else ""


def _latest(entries: list[tuple[tuple, str, object]]) -> list[tuple[str, object]]:
    """Keep the latest ``(file, value)`` per key from ``(key, file, value)`` entries given oldest first."""
    latest: dict[tuple, tuple[str, object]] = {}
    for key, name, value in entries:
        latest[key] = (name, value)
    return [latest[k] for k in sorted(latest, key=str)]


def _threads(record: dict) -> int | None:
    return record.get("threads", record.get("environment", {}).get("threads"))


def latency_data(results: Path) -> dict:
    """(a) p50 latency of the flat records, the latest per configuration and device, grouped by device."""
    entries = []
    for name, rec in _load(results, "*.json"):
        if not isinstance(rec, dict) or not all(k in rec for k in FLAT_FIELDS) or "clients" in rec:
            continue  # load tests (``clients``) time a server under concurrent requests, not one call
        key = tuple(rec[k] for k in CONFIG_FIELDS)
        row = {k: rec[k] for k in CONFIG_FIELDS}
        row.update(p50_ms=rec["p50_ms"], threads=_threads(rec), device_type=rec.get("device_type"), file=name)
        entries.append((key, name, row))
    rows = [row for _, row in _latest(entries)]
    devices: dict[str, list] = {}
    for row in rows:
        devices.setdefault(row["device"], []).append(row)
    return {"devices": {d: sorted(r, key=lambda x: (x["model"], x["preset"], x["dtype"], x["batch"], x["views"],
                                                    x["backend"], x["capture"]))
                        for d, r in sorted(devices.items())},
            "sources": sorted({row["file"] for row in rows})}  # fmt: skip


def _pair(workload: str, device: str, settings: str, ours_label: str, ours_ms: float, other_label: str,
          other_ms: float, name: str, unit: str = "ms median") -> tuple:  # fmt: skip
    row = {"workload": workload, "device": device, "settings": settings, "ours": ours_label, "ours_value": ours_ms,
           "upstream": other_label, "upstream_value": other_ms, "unit": unit, "ratio": ours_ms / other_ms,
           "file": name}  # fmt: skip
    return ((workload, device), name, row)


def upstream_data(results: Path) -> dict:
    """(b) our median against the upstream implementation's, per workload (the latest file per workload and device)."""
    entries = []
    for name, rec in _load(results, "*lerobot_vs_ours*.json"):
        if "families" in rec and isinstance(rec["families"], dict):  # one training step
            for family, r in sorted(rec["families"].items()):
                entries.append(_pair(f"{family} train step (tiny)", rec.get("cpu", rec["device"]),
                                     f"{rec.get('threads')} thread(s), {rec.get('what', '')}", "ours",
                                     r["ours"]["p50_ms"], "LeRobot", r["lerobot"]["p50_ms"], name))  # fmt: skip
            continue
        same = " same shapes" if rec.get("settings", {}).get("same_shapes") else ""
        for family, r in sorted(rec["results"].items()):
            for batch in sorted(k for k in r if k.startswith("batch")):
                b = r[batch]
                settings = f"{rec.get('threads')} thread(s), {rec['settings'].get('dtype', 'float32')}, " \
                           f"{rec['settings'].get('num_steps', '?')} steps"  # fmt: skip
                entries.append(_pair(f"{family} {rec['config']}{same} b{batch[5:]}", rec["device"], settings, "ours",
                                     b["ours"]["p50_ms"], "LeRobot", b["lerobot"]["p50_ms"], name))  # fmt: skip
                if "ours_same_shapes" in b:
                    entries.append(_pair(f"{family} {rec['config']} same shapes b{batch[5:]}", rec["device"], settings,
                                         "ours", b["ours_same_shapes"]["p50_ms"], "LeRobot",
                                         b["lerobot"]["p50_ms"], name))  # fmt: skip
    for name, rec in _load(results, "*groot_isaac_vs_ours*.json"):
        theirs = {(r["embodiment"], r["batch"], r["views"]): r for r in rec["results"] if r["implementation"] != "ours"}
        for r in rec["results"]:
            key = (r["embodiment"], r["batch"], r["views"])
            if r["implementation"] == "ours" and key in theirs:
                entries.append(_pair(f"groot {rec['preset']} {key[0]} b{key[1]} v{key[2]}", rec["device"],
                                     f"{rec.get('threads')} thread(s), {rec['dtype']}, {rec['steps']} steps", "ours",
                                     r["p50_ms"], "Isaac-GR00T", theirs[key]["p50_ms"], name))  # fmt: skip
    for name, rec in _load(results, "*hy3dgen_vs_ours*.json"):
        entries.append(_pair(f"hunyuan3d shape {rec['preset']} total", rec["device"],
                             f"{rec.get('threads')} thread(s), {rec['dtype']}, {rec['steps']} steps, "
                             f"octree {rec['octree_resolution']}, dense decoding", "ours",
                             rec["ours_dense_total_p50_ms"], "hy3dgen", rec["upstream_total_p50_ms"], name))  # fmt: skip
    for name, rec in _load(results, "*hunyuan3d_paint_geometry_vs_official*.json"):
        entries.append(_pair(f"hunyuan3d paint geometry {rec['render_size']} px", rec["device"],
                             f"{rec.get('threads')} thread(s), {rec['mesh_faces']} faces, texture {rec['texture_size']}",
                             "ours", rec["ours_total_s"] * 1e3, "official", rec["official_total_s"] * 1e3, name,
                             unit="ms (one run)"))  # fmt: skip
    for name, rec in _load(results, "*hunyuan3d_paint_texture_stage_vs_official*.json"):
        ours, official = rec["sides"]["ours"]["summary"], rec["sides"]["official"]["summary"]
        entries.append(_pair(f"hunyuan3d paint texture stage {rec['render_size']} px, {rec['threads']} thr, "
                             f"OMP_WAIT_POLICY {rec['omp_wait_policy']}", rec["device"],
                             f"{rec['mesh_faces']} faces, tiny diffusion models, {rec['steps']} + {rec['delight_steps']} "
                             "steps", "ours", ours["cpu_s_median"] * 1e3, "official", official["cpu_s_median"] * 1e3,
                             name, unit="ms CPU time (median)"))  # fmt: skip
    for name, rec in _load(results, "*onnxruntime-vs-torch*.json"):
        onnx = {(r["model"], r["preset"], r["batch"], r["views"]): r for r in rec["results"]
                if r.get("runtime") == "onnxruntime"}  # fmt: skip
        for r in rec["results"]:
            key = (r["model"], r["preset"], r["batch"], r["views"])
            if r.get("runtime") == "torch" and r["capture"] == "eager" and key in onnx:
                entries.append(_pair(f"{r['preset']} torch eager vs onnxruntime", r["device"],
                                     f"{_threads(rec)} thread(s), {r['dtype']}", "torch eager (ours)", r["p50_ms"],
                                     f"onnxruntime {onnx[key].get('onnxruntime_version', '')}".strip(),
                                     onnx[key]["p50_ms"], name))  # fmt: skip
    rows = [row for _, row in _latest(entries)]
    return {"rows": rows, "sources": sorted({row["file"] for row in rows})}


def cache_data(results: Path) -> dict:
    """(c) DiT-cache speed against quality: the latest file of each experiment."""
    panels = []
    sweeps = _load(results, "*hunyuan3d_cache_sweep*.json")
    if sweeps:
        name, rec = sweeps[-1]
        panels.append({"experiment": "hunyuan3d shape sampling", "file": name, "device": rec["device"],
                       "settings": f"{rec['preset']}, {rec['steps']} steps, octree {rec['octree_resolution']}, "
                                   f"{rec['dtype']}, median of {rec['runs']} runs",
                       "x_label": "sampling speed-up (uncached / cached)", "speedup_axis": True, "y_label": "F-score@0.01 vs uncached",
                       "points": [{"label": r["label"], "method": r["method"], "x": r["speedup"],
                                   "y": r["fscore@0.01"]} for r in rec["rows"]]})  # fmt: skip
    for pattern, title in (("*cache_groot_action_head*.json", "GR00T action head"),
                           ("*cache_pi0_expert*.json", "pi0 / pi0.5 action expert")):  # fmt: skip
        files = _load(results, pattern)
        if not files:
            continue
        name, rec = files[-1]
        timed = all("action_head_ms" in r for r in rec["rows"])
        points = []
        for r in rec["rows"]:
            x = r["uncached_action_head_ms"] / r["action_head_ms"] if timed else r["reused_steps"] / r["steps"]
            points.append({"label": f"{r['preset']} {r['steps']} steps {r['cache']}", "method": r["method"], "x": x,
                           "y": r["action_mean_abs_error"] / r["action_scale"]})  # fmt: skip
        panels.append({"experiment": title, "file": name, "device": rec["device"],
                       "settings": ", ".join([rec["backend"], rec["dtype"],
                                          *([f"{rec['threads']} thread(s)"] if "threads" in rec else []),
                                          "random-weight tiny presets"]),
                       "speedup_axis": timed,
                       "x_label": "action-head speed-up (uncached / cached)" if timed else "fraction of steps reused",
                       "y_label": "mean |action error| / action scale", "points": points})  # fmt: skip
    return {"panels": panels, "sources": sorted({p["file"] for p in panels})}


def memory_data(results: Path) -> dict:
    """(d) VGGT memory growth against frame count, per implementation (the latest file)."""
    files = _load(results, "*vggt_memory*.json")
    if not files:
        return {"sources": []}
    name, rec = files[-1]
    series: dict[str, dict] = {}
    for r in rec["records"]:
        s = series.setdefault(r["impl"], {"frames": [], "growth_mb": [], "predicted_peak_growth_mb": []})
        s["frames"].append(r["frames"])
        s["growth_mb"].append(r["growth_mb"])
        s["predicted_peak_growth_mb"].append(r.get("predicted_peak_growth_mb"))
    official = "; official: its DPT heads' default chunk, 8" if "official" in series else ""
    return {"device": rec["device"], "settings": f"{rec['preset']}; {rec['dtype']}, {rec.get('threads')} thread(s), "
                                                  f"frame chunks of {rec['frames_chunk_size']}{official}",
            "measure": rec.get("measure", ""), "series": series, "sources": [name]}  # fmt: skip


TEXTURE_STAGES = ("delight", "UV unwrap", "condition maps", "multiview diffusion", "baking", "inpainting")


def _stage_split(stages: dict, total: float) -> dict:
    """Seconds per texture stage (rounded to ms) and ``other``: what the total holds beside them."""
    split = {s: round(stages.get(s, 0.0), 3) for s in TEXTURE_STAGES}
    split["other"] = round(max(total - sum(stages.get(s, 0.0) for s in TEXTURE_STAGES), 0.0), 3)
    return split


def _median_run(runs: list[dict]) -> dict:
    """The run whose CPU time is the median (the lower middle one of an even count): its stages add up."""
    ordered = sorted(runs, key=lambda r: r["cpu_s"])
    return ordered[(len(ordered) - 1) // 2]


def texture_stage_data(results: Path) -> dict:
    """(e) Hunyuan3D-Paint's texture stage stage by stage: the official pipeline against ours end to end (CPU seconds
    per stage of each side's median run; the latest file per device, threads and wait policy), and the Python API's
    stages at 1 and 2 intra-op threads (medians; the latest file with them)."""
    entries = []
    for name, rec in _load(results, "*hunyuan3d_paint_texture_stage_vs_official*.json"):
        official, ours = rec["sides"]["official"], rec["sides"]["ours"]
        official_run, ours_run = _median_run(official["runs"]), _median_run(ours["sequential"])
        row = {"device": rec["device"], "threads": rec["threads"], "policy": rec["omp_wait_policy"],
               "size": rec["render_size"], "faces": rec["mesh_faces"], "file": name,
               "official": _stage_split(official_run["stage_cpu_s"], official_run["cpu_s"]),
               "ours": _stage_split(ours_run["stage_cpu_s"], ours_run["cpu_s"]),
               "official_cpu_s": round(official["summary"]["cpu_s_median"], 3),
               "official_wall_s": round(official["summary"]["wall_s_median"], 3),
               "ours_generate_cpu_s": round(ours["summary"]["cpu_s_median"], 3),
               "ours_generate_wall_s": round(ours["summary"]["wall_s_median"], 3)}  # fmt: skip
        entries.append(((rec["device"], rec["threads"], rec["omp_wait_policy"]), name, row))
    comparisons = [row for _, row in _latest(entries)]
    api, sources = None, {row["file"] for row in comparisons}
    files = [(n, r) for n, r in _load(results, "*hunyuan3d_paint_texture_stage_cpu_*.json") if "api_threads" in r]
    if files:
        name, rec = files[-1]
        api = {"file": name, "device": rec["device"], "size": rec["size"], "repeats": rec["repeats"], "policies": {}}
        for policy, part in sorted(rec["api_threads"].items()):
            api["policies"][policy] = {run: {s: {"cpu_s": round(v["cpu_s"], 3), "wall_s": round(v["wall_s"], 3)}
                                             for s, v in stages.items()}
                                       for run, stages in part["median"].items()}  # fmt: skip
        sources.add(name)
    return {"comparisons": comparisons, "api_threads": api, "sources": sorted(sources)}


FIGURES = {
    "latency": latency_data,
    "upstream": upstream_data,
    "dit_cache": cache_data,
    "vggt_memory": memory_data,
    "texture_stage": texture_stage_data,
}


def canonical(data) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def data_hash(data) -> str:
    return hashlib.sha256(canonical(data)).hexdigest()


def _source_hash(path: Path) -> str:
    """SHA-256 of a results file's parsed content (canonical JSON: independent of line endings and indentation)."""
    return data_hash(json.loads(path.read_text(encoding="utf-8")))


def collect(results: Path) -> dict:
    """Every figure's plotted data, its sources and hash, as ``figures.json`` holds them."""
    if not results.is_dir():
        raise ValueError(f"--results {results}: not a directory")
    figures = {}
    for name, extract in FIGURES.items():
        data = extract(results)
        sources = data.pop("sources")
        figures[name] = {"png": f"{name}.png", "sources": sources, "data": data,
                         "sha256": data_hash({"sources": sources, "data": data}),
                         "source_sha256": {s: _source_hash(results / s) for s in sources}}  # fmt: skip
    return figures


# ---------------------------------------------------------------------------------------------------------- drawing


def _draw_latency(plt, data):
    devices = data["devices"]
    heights = [max(2.0, 0.28 * len(rows) + 1.0) for rows in devices.values()]
    fig, axes = plt.subplots(len(devices), 1, figsize=(9, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights}, layout="constrained")  # fmt: skip
    colors = {"eager": "tab:blue", "compile": "tab:orange", "graph": "tab:green"}
    for ax, (device, rows) in zip(axes[:, 0], devices.items(), strict=True):
        labels = [f"{r['preset']} ({r['model']}) {r['dtype']} b{r['batch']} v{r['views']} | {r['backend']}, "
                  f"{r['threads']} thr" for r in rows]  # fmt: skip
        values = [r["p50_ms"] for r in rows]
        ax.barh(range(len(rows)), values, color=[colors.get(r["capture"], "tab:gray") for r in rows])
        for i, (v, r) in enumerate(zip(values, rows, strict=True)):
            ax.text(v, i, f" {v:.1f} ms ({r['capture']})", va="center", fontsize=7)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        kinds = "/".join(sorted({r["device_type"] for r in rows if r["device_type"]}))
        ax.set_title(f"{device} ({kinds + '; ' if kinds else ''}thr = torch threads): p50 latency per call", fontsize=9)
        ax.set_xlabel("p50 ms (log scale); colour = capture mode", fontsize=8)
        ax.set_xlim(min(values) / 2, max(values) * 4)
    fig.suptitle("Latency per capture mode and backend (latest record per configuration and device)", fontsize=10)
    return fig


def _draw_upstream(plt, data):
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(rows) + 1.6))
    ratios = [r["ratio"] for r in rows]
    ax.barh(range(len(rows)), ratios, color=["tab:green" if x < 1 else "tab:red" for x in ratios])
    ax.axvline(1.0, color="black", linewidth=0.8)
    for i, r in enumerate(rows):
        ax.text(r["ratio"], i, f" {r['ours_value']:.4g} vs {r['upstream_value']:.4g} {r['unit']}", va="center",
                fontsize=6.5)  # fmt: skip
    ax.set_yticks(range(len(rows)), [f"{r['workload']} vs {r['upstream']} [{r['device']}]" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(min(ratios) / 1.5, max(ratios) * 6)
    ax.set_xlabel("our time / upstream time (log scale; < 1: ours faster); labels: ours vs upstream", fontsize=8)
    ax.set_title("Speed against the upstream implementations, CPU (latest file per workload and device)", fontsize=9)
    return fig


def _draw_cache(plt, data):
    panels = data["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    markers = {"none": "s", "fbcache": "o", "teacache": "^", "taylorseer": "D"}
    for ax, panel in zip(axes[0], panels, strict=True):
        for method in sorted({p["method"] for p in panel["points"]}):
            pts = [p for p in panel["points"] if p["method"] == method]
            ax.scatter([p["x"] for p in pts], [p["y"] for p in pts], marker=markers.get(method, "x"), label=method,
                       alpha=0.75)  # fmt: skip
        if panel["speedup_axis"]:
            ax.axvline(1.0, color="gray", linewidth=0.6)
        ax.set_xlabel(panel["x_label"], fontsize=8)
        ax.set_ylabel(panel["y_label"], fontsize=8)
        ax.set_title(f"{panel['experiment']} [{panel['device']}]\n{panel['settings']}", fontsize=7.5)
        ax.legend(fontsize=7)
    fig.suptitle("DiT cache: speed against quality (random-weight tiny presets, CPU)", fontsize=10)
    fig.tight_layout()
    return fig


def _draw_memory(plt, data):
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for impl, s in data["series"].items():
        (line,) = ax.plot(s["frames"], s["growth_mb"], marker="o", label=f"{impl} (measured)")
        if all(v is not None for v in s["predicted_peak_growth_mb"]) and impl == "streamed":
            ax.plot(s["frames"], s["predicted_peak_growth_mb"], linestyle="--", color="gray", label="--plan estimate")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("frames")
    ax.set_ylabel("peak RSS growth during the call (MB)")
    ax.set_title(f"VGGT memory against frame count [{data['device']}]\n{data['settings']}", fontsize=7.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _draw_texture_stage(plt, data):
    comparisons, api = data["comparisons"], data["api_threads"]
    fig, axes = plt.subplots(1, 2, figsize=(15, max(4.2, 1.3 * len(comparisons) + 2.4)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.6, 1]})  # fmt: skip
    ax = axes[0][0]
    stages = (*TEXTURE_STAGES, "other")
    colors = dict(zip(stages, plt.get_cmap("tab10").colors, strict=False))
    labels = []
    for i, row in enumerate(comparisons):
        for k, side in enumerate(("official", "ours")):
            y, left = 2.6 * i + k, 0.0
            for stage in stages:
                value = row[side][stage]
                ax.barh(y, value, 0.8, left=left, color=colors[stage], label=stage if i == 0 and k == 0 else None)
                left += value
            wall = row["official_wall_s"] if side == "official" else row["ours_generate_wall_s"]
            whole = row["official_cpu_s"] if side == "official" else row["ours_generate_cpu_s"]
            ax.text(left, y, f" {left:.1f} s CPU by stage; whole call {whole:.1f} s CPU, {wall:.0f} s wall",
                    va="center", fontsize=7)  # fmt: skip
            labels.append((y, f"{side}\n{row['threads']} thr, wait policy {row['policy']}"))
    ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(max(sum(r[s].values()) for s in ("official", "ours")) for r in comparisons) * 1.9)
    ax.set_xlabel("CPU seconds per stage (process time, the median run; ours: the stages one after another)",
                  fontsize=8)  # fmt: skip
    first = comparisons[0]
    ax.set_title(f"official Hunyuan3DPaintPipeline vs ours, {first['faces']} faces, {first['size']}², tiny diffusion "
                 f"models [{first['device']}]", fontsize=8.5)  # fmt: skip
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(stages))
    ax = axes[0][1]
    if api:
        policy = "spin" if "spin" in api["policies"] else sorted(api["policies"])[0]
        runs = api["policies"][policy]
        names = [("1", "1 thread"), ("2", "2 threads (stages choose)"), ("2_diffusion_forced", "2 threads, diffusion forced")]
        shown = [s for s in (*TEXTURE_STAGES, "generate") if s in runs["1"]]
        width = 0.8 / len(names)
        for k, (run, label) in enumerate(n for n in names if n[0] in runs):
            x = [i + width * k for i in range(len(shown))]
            bars = ax.bar(x, [runs[run][s]["cpu_s"] for s in shown], width, label=label)
            ax.bar_label(bars, fmt="%.1f", fontsize=6)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shown))], [s.replace(" ", "\n") for s in shown], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("CPU seconds (median; log scale)", fontsize=8)
        ax.set_title(f"Python API, OMP_WAIT_POLICY {'unset' if policy == 'spin' else policy}, {api['size']}² "
                     f"[{api['device']}]", fontsize=8.5)  # fmt: skip
        ax.legend(fontsize=7)
    else:
        ax.set_axis_off()
    fig.suptitle("Hunyuan3D-Paint texture stage on the CPU, stage by stage", fontsize=10)
    fig.tight_layout()
    return fig


DRAW = {"latency": _draw_latency, "upstream": _draw_upstream, "dit_cache": _draw_cache, "vggt_memory": _draw_memory,
        "texture_stage": _draw_texture_stage}


def write(results: Path, out: Path) -> list[Path]:
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("matplotlib is needed to draw the figures: pip install 'embodied-accel[profile]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = collect(results)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, entry in figures.items():
        fig = DRAW[name](plt, entry["data"])
        path = out / entry["png"]
        fig.savefig(path, dpi=110, bbox_inches="tight",
                    metadata={HASH_KEY: entry["sha256"], "Source": "tools/make_figures.py"})  # fmt: skip
        plt.close(fig)
        written.append(path)
    index = out / INDEX_NAME
    index.write_text(json.dumps(figures, indent=1, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
    return [*written, index]


# ---------------------------------------------------------------------------------------------------------- checking


def png_text(path: Path) -> dict[str, str]:
    """The ``tEXt`` / ``iTXt`` / ``zTXt`` chunks of a PNG file as a dict (no image library needed)."""
    blob = path.read_bytes()
    if blob[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    text, pos = {}, 8
    while pos + 8 <= len(blob):
        length, kind = struct.unpack(">I4s", blob[pos:pos + 8])
        body = blob[pos + 8:pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            text[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _, _, rest = rest.partition(b"\0")  # language tag
            _, _, value = rest.partition(b"\0")  # translated keyword
            text[key.decode("utf-8")] = (zlib.decompress(value) if compressed else value).decode("utf-8")
        elif kind == b"IEND":
            break
        pos += 12 + length
    return text


def check(results: Path, out: Path) -> list[str]:
    """Problems that make the committed figures out of sync with ``results`` (empty: in sync)."""
    figures = collect(results)
    index = out / INDEX_NAME
    if not index.is_file():
        return [f"{index}: missing (run python tools/make_figures.py)"]
    committed = json.loads(index.read_text(encoding="utf-8"))
    problems = []
    for name in sorted(set(committed) - set(figures)):
        problems.append(f"{name}: in {index} but no longer drawn")
    for name, entry in figures.items():
        old = committed.get(name)
        if old is None:
            problems.append(f"{name}: not in {index}")
            continue
        if old.get("sources") != entry["sources"]:
            added = sorted(set(entry["sources"]) - set(old.get("sources", [])))
            gone = sorted(set(old.get("sources", [])) - set(entry["sources"]))
            problems.append(f"{name}: source files changed (new: {added or '-'}; no longer used: {gone or '-'})")
        elif old.get("data") != entry["data"] or old.get("sha256") != entry["sha256"]:
            changed = [s for s in entry["sources"] if old.get("source_sha256", {}).get(s) != entry["source_sha256"][s]]
            problems.append(f"{name}: the plotted data differs from what {index} holds (changed files: "
                            f"{', '.join(changed) or 'none; the extraction changed'})")  # fmt: skip
        png = out / entry["png"]
        if not png.is_file():
            problems.append(f"{png}: missing")
            continue
        embedded = png_text(png).get(HASH_KEY)
        if embedded != entry["sha256"]:
            problems.append(f"{png}: embedded data hash {embedded} is not that of the current data {entry['sha256']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results folder (default: bench/results)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="figures folder (default: docs/figures)")
    parser.add_argument("--check", action="store_true", help="verify the figures are in sync; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.results, args.out)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("figures out of sync: run python tools/make_figures.py", file=sys.stderr)
            return 1
        print(f"{args.out}: in sync with {args.results}")
        return 0
    for path in write(args.results, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
