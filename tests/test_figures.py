"""The results figures in docs/figures are in sync with bench/results (data and embedded hashes, not pixels)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "tools" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_figures_are_in_sync(figures):
    problems = figures.check(ROOT / "bench" / "results", ROOT / "docs" / "figures")
    assert problems == [], "\n".join(problems) + "\nrun: python tools/make_figures.py"


def test_every_figure_has_data_and_sources(figures):
    index = json.loads((ROOT / "docs" / "figures" / "figures.json").read_text(encoding="utf-8"))
    for name in figures.FIGURES:
        assert index[name]["sources"], name
        for source in index[name]["sources"]:
            assert (ROOT / "bench" / "results" / source).is_file(), source
        assert figures.png_text(ROOT / "docs" / "figures" / index[name]["png"])[figures.HASH_KEY] == index[name]["sha256"]


def _copy_results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    shutil.copytree(ROOT / "bench" / "results", results, ignore=shutil.ignore_patterns("*.png"))
    return results


def test_check_fails_when_a_value_changes(figures, tmp_path):
    results = _copy_results(tmp_path)
    name = json.loads((ROOT / "docs" / "figures" / "figures.json").read_text(encoding="utf-8"))["vggt_memory"]["sources"][0]
    record = json.loads((results / name).read_text(encoding="utf-8"))
    record["records"][0]["growth_mb"] += 1.0
    (results / name).write_text(json.dumps(record), encoding="utf-8")
    problems = figures.check(results, ROOT / "docs" / "figures")
    assert any(p.startswith("vggt_memory: the plotted data differs") and name in p for p in problems), problems
    assert any("vggt_memory.png: embedded data hash" in p for p in problems), problems
    assert not any(p.startswith("latency") for p in problems), problems


def test_check_fails_when_a_results_file_is_added(figures, tmp_path):
    results = _copy_results(tmp_path)
    src = next(results.glob("*_pi0_pi0-tiny_reference_compile_float32_b1_v2_intel-r-xeon-r-processor.json"))
    record = json.loads(src.read_text(encoding="utf-8"))
    record["p50_ms"] *= 0.5
    (results / "29991231T000000Z_pi0_pi0-tiny_reference_compile_float32_b1_v2_intel-r-xeon-r-processor.json").write_text(
        json.dumps(record), encoding="utf-8")
    assert figures.main(["--check", "--results", str(results), "--out", str(ROOT / "docs" / "figures")]) == 1
    problems = figures.check(results, ROOT / "docs" / "figures")
    assert any(p.startswith("latency: source files changed") and "29991231T000000Z" in p for p in problems), problems


def test_check_fails_on_a_png_drawn_from_other_data(figures, tmp_path):
    out = tmp_path / "figures"
    shutil.copytree(ROOT / "docs" / "figures", out)
    stale = out / "upstream.png"
    shutil.copyfile(out / "latency.png", stale)
    problems = figures.check(ROOT / "bench" / "results", out)
    assert problems and all("upstream.png: embedded data hash" in p for p in problems), problems


def test_bad_results_folder_is_named(figures, tmp_path):
    with pytest.raises(ValueError, match="--results"):
        figures.check(tmp_path / "absent", ROOT / "docs" / "figures")
