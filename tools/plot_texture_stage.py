"""Draw the texture stage's times from ``texture_stage_bench.py`` records as one PNG: UV unwrap CPU time per mode,
the geometry stages' CPU and wall time at 1 and 2 threads under each OpenMP wait policy, and the whole stage's
per-stage wall time end to end.

    python tools/plot_texture_stage.py bench/results/*_hunyuan3d_paint_texture_stage_cpu_2048.json \
        -o docs/images/texture_stage_cpu.png [--markdown]

Each part is taken from the last record given that holds it. ``--markdown`` also prints, from the records given,
the Python API's stages at 1 and 2 threads (``api_threads``) and the official pipeline against ours end to end
(``hunyuan3d_paint_reference/end_to_end_cpu.py``'s records, one table row pair per record); the chart of those two is
``tools/make_figures.py``'s ``texture_stage`` figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GEOMETRY_STAGES = ("maps", "bake", "inpaint")
THREAD_RUNS = (("spin", "2_forced", "2 threads, spinning workers (before)"), ("spin", "1", "1 thread, spinning workers"),
               ("spin", "2", "2 threads asked, spinning workers (stages pick 1)"),
               ("passive", "1", "1 thread, sleeping workers"), ("passive", "2", "2 threads, sleeping workers"))  # fmt: skip
PIPELINE_STAGES = ("UV unwrap", "condition maps", "delight", "multiview diffusion", "baking", "inpainting")


def _parts(paths: list[Path]) -> dict:
    parts: dict = {"vs_official": []}
    for path in paths:
        record = json.loads(path.read_text(encoding="utf-8"))
        for name in ("unwrap", "geometry_threads", "end_to_end", "api_threads"):
            if name in record:
                parts[name] = (record, path.name)
        if "sides" in record:
            parts["vs_official"].append((record, path.name))
    return parts


API_STAGES = ("delight", "UV unwrap", "condition maps", "multiview diffusion", "baking", "inpainting", "generate")
OFFICIAL_STAGES = ("delight", "UV unwrap", "condition maps", "multiview diffusion", "baking", "inpainting")


def _api_table(record: dict, name: str) -> list[str]:
    lines = []
    for policy, part in record["api_threads"].items():
        median, ratio = part["median"], part["ratio_2_to_1"]
        load = part.get("load_average", {})
        lines += [f"Python API, OMP_WAIT_POLICY {'unset' if policy == 'spin' else 'PASSIVE'}, tiny presets, "
                  f"{record['size']}² (`{name}`; CPU s / wall s, medians of {record['repeats']}; diffusion forced: one "
                  f"run; load average {load.get('before')} before, {load.get('after')} after):", "",
                  "| threads | " + " | ".join(API_STAGES) + " |", "|---|" + "---|" * len(API_STAGES)]  # fmt: skip
        for run, label in (("1", "1"), ("2", "2 (stages choose)"), ("2_diffusion_forced", "2, diffusion forced")):
            if run in median:
                cells = [f"{median[run][s]['cpu_s']:.2f} / {median[run][s]['wall_s']:.1f}" for s in API_STAGES]
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("| 2 ÷ 1, CPU / wall | " + " | ".join(f"{ratio[s]['cpu']:.2f} / {ratio[s]['wall']:.2f}"
                                                          for s in API_STAGES) + " |")  # fmt: skip
        lines.append("")
    return lines


def _official_table(records: list) -> list[str]:
    lines = ["Official `Hunyuan3DPaintPipeline` against ours, end to end (CPU s per stage of each side's median run, "
             "by CPU time; ours: the stages one after another; whole call: medians, ours `generate` with delight beside "
             "the unwrap and maps):", "",
             "| record | threads, wait policy | side | " + " | ".join(OFFICIAL_STAGES) + " | other | stages, CPU | "
             "whole call, CPU / wall | load average |",
             "|---|---|---|" + "---|" * (len(OFFICIAL_STAGES) + 4)]  # fmt: skip
    for record, name in records:
        for side in ("official", "ours"):
            entry = record["sides"][side]
            runs = sorted(entry["sequential" if side == "ours" else "runs"], key=lambda r: r["cpu_s"])
            run = runs[(len(runs) - 1) // 2]
            by_stage = run["stage_cpu_s"]
            other = run["cpu_s"] - sum(by_stage.get(s, 0.0) for s in OFFICIAL_STAGES)
            whole = entry["summary"]
            label = "ours" if side == "ours" else "official"
            lines.append(f"| `{name[:16]}` | {record['threads']}, {record['omp_wait_policy']} | {label} | "
                         + " | ".join(f"{by_stage.get(s, 0.0):.2f}" for s in OFFICIAL_STAGES)
                         + f" | {other:.2f} | {run['cpu_s']:.1f} | {whole['cpu_s_median']:.1f} / "
                         f"{whole['wall_s_median']:.0f} | {entry['load_average_before']} → "
                         f"{entry['load_average_after']} |")  # fmt: skip
    lines.append("")
    return lines


def markdown_tables(parts: dict) -> str:
    """The figures of the chart as Markdown tables (for docs/texture_performance.md)."""
    lines = []
    if "unwrap" in parts:
        record, name = parts["unwrap"]
        lines += [f"UV unwrap (`{name}`; CPU and wall seconds: medians of {record['repeats']}):", "",
                  "| mesh | mode | CPU s | wall s | islands | utilization | overlapping texels | seam length | "
                  "max stretch | p99 stretch | max anisotropy |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for mesh, entry in record["unwrap"].items():
            for mode in ("default", "fast"):
                q = entry[mode]["quality"]
                lines.append(f"| {mesh} ({entry['faces']} faces) | {mode} | {entry[mode]['cpu_s_median']:.2f} | "
                             f"{entry[mode]['wall_s_median']:.2f} | {q['islands']} | {q['utilization']:.3f} | "
                             f"{q['overlapping_texels']} | {q['seam_length']:.1f} | {q['max_stretch']:.2f} | "
                             f"{q['p99_stretch']:.3f} | {q['max_anisotropy']:.2f} |")  # fmt: skip
        lines.append("")
    if "geometry_threads" in parts:
        record, name = parts["geometry_threads"]
        lines += [f"Geometry stages at {record['size']}² (`{name}`; CPU s / wall s, medians of {record['repeats']}; "
                  "2 threads forced: one run):", "",
                  "| workers | threads | " + " | ".join(GEOMETRY_STAGES) + " | CPU ratio to 1 thread |",
                  "|---|---|" + "---|" * (len(GEOMETRY_STAGES) + 1)]  # fmt: skip
        for policy, run, label in THREAD_RUNS:
            median = record["geometry_threads"][policy]["median"]
            cells = [f"{median[run][s]['cpu_s']:.2f} / {median[run][s]['wall_s']:.1f}" for s in GEOMETRY_STAGES]
            ratios = [median[run][s]["cpu_s"] / median["1"][s]["cpu_s"] for s in GEOMETRY_STAGES]
            lines.append(f"| {'spinning' if policy == 'spin' else 'sleeping'} | {label} | " + " | ".join(cells)
                         + " | " + ", ".join(f"{r:.2f}" for r in ratios) + " |")  # fmt: skip
        lines.append("")
    if "end_to_end" in parts:
        record, name = parts["end_to_end"]
        lines += [f"Whole stage, `{'` + `'.join(record['end_to_end']['passive']['models'])}`, {record['size']}² "
                  f"(`{name}`; wall seconds per stage, medians of {record['end_to_end_repeats']}):", "",
                  "| workers | unwrap | " + " | ".join(PIPELINE_STAGES) + " | total wall | total CPU |",
                  "|---|---|" + "---|" * (len(PIPELINE_STAGES) + 2)]  # fmt: skip
        for policy in ("spin", "passive"):
            for mode in ("default", "fast"):
                entry = record["end_to_end"][policy][mode]
                cells = [f"{entry['stage_wall_s_median'].get(s, 0.0):.1f}" for s in PIPELINE_STAGES]
                lines.append(f"| {'spinning' if policy == 'spin' else 'sleeping'} | {mode} | " + " | ".join(cells)
                             + f" | {entry['wall_s_median']:.1f} | {entry['cpu_s_median']:.1f} |")  # fmt: skip
        lines.append("")
    if "api_threads" in parts:
        lines += _api_table(*parts["api_threads"])
    if parts.get("vs_official"):
        lines += _official_table(parts["vs_official"])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, nargs="+")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--markdown", action="store_true", help="also print the figures as Markdown tables")
    args = parser.parse_args()
    parts = _parts(args.records)
    comparisons = parts.pop("vs_official")
    if args.markdown:
        print(markdown_tables({**parts, "vs_official": comparisons}))
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1, 2.2, 1.6]})
    if "unwrap" in parts:
        record, _ = parts["unwrap"]
        ax = axes[0]
        meshes = list(record["unwrap"])
        for k, mode in enumerate(("default", "fast")):
            values = [record["unwrap"][m][mode]["cpu_s_median"] for m in meshes]
            bars = ax.bar([i + 0.38 * k for i in range(len(meshes))], values, 0.36, label=mode)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_xticks([i + 0.19 for i in range(len(meshes))],
                      [f"{m}\n({record['unwrap'][m]['faces']} faces)" for m in meshes], fontsize=8)  # fmt: skip
        ax.set_ylabel("CPU seconds (median)")
        ax.set_title("UV unwrap (xatlas)")
        ax.legend(fontsize=8)
    if "geometry_threads" in parts:
        record, _ = parts["geometry_threads"]
        ax = axes[1]
        width = 0.8 / len(THREAD_RUNS)
        for k, (policy, run, label) in enumerate(THREAD_RUNS):
            median = record["geometry_threads"][policy]["median"][run]
            x = [i + width * k for i in range(len(GEOMETRY_STAGES))]
            bars = ax.bar(x, [median[s]["cpu_s"] for s in GEOMETRY_STAGES], width, label=label)
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
            ax.scatter(x, [median[s]["wall_s"] for s in GEOMETRY_STAGES], marker="_", s=120, color="black",
                       zorder=3, label="wall time" if k == 0 else None)  # fmt: skip
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(GEOMETRY_STAGES))], GEOMETRY_STAGES)
        ax.set_ylabel("seconds (bars: CPU time, marks: wall; medians)")
        ax.set_title(f"geometry stages at {record['size']}² (21k faces)")
        ax.legend(fontsize=7)
    if "end_to_end" in parts:
        record, _ = parts["end_to_end"]
        ax = axes[2]
        labels, bottoms = [], []
        columns = [(p, m) for p in ("spin", "passive") for m in ("default", "fast")]
        bottoms = [0.0] * len(columns)
        for stage in (s for s in PIPELINE_STAGES if s != "delight"):  # delight runs beside unwrap + maps
            values = [record["end_to_end"][p][m]["stage_wall_s_median"].get(stage, 0.0) for p, m in columns]
            ax.bar(range(len(columns)), values, 0.6, bottom=bottoms, label=stage)
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        totals = [record["end_to_end"][p][m]["wall_s_median"] for p, m in columns]
        for i, total in enumerate(totals):
            ax.text(i, bottoms[i], f"{total:.0f} s", ha="center", va="bottom", fontsize=8)
        labels = [f"{'spinning' if p == 'spin' else 'sleeping'}\nworkers\nunwrap {m}" for p, m in columns]
        ax.set_xticks(range(len(columns)), labels, fontsize=8)
        ax.set_ylabel("wall seconds per stage (delight, beside unwrap + maps, not stacked)")
        ax.set_title(f"whole stage, tiny diffusion models, {record['size']}²")
        ax.legend(fontsize=7)
    if not parts:
        return  # only end-to-end comparisons: their chart is tools/make_figures.py's
    device = next(iter(parts.values()))[0]
    fig.suptitle(f"Hunyuan3D-Paint texture stage on the CPU ({device['device']}, {device['cpu_count']} cores, shared)",
                 fontsize=11)  # fmt: skip
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=110)
    print(args.output)


if __name__ == "__main__":
    main()
