"""The family registry: run / info / bench / profile on a model of every family, with the same result-file fields,
and the options of one family refused for another."""

from __future__ import annotations

import json

import pytest

from embodied_accel import cli
from embodied_accel.bench.harness import RESULT_KEYS
from embodied_accel.families import FAMILIES, family_of, preset_names


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_preset_belongs_to_exactly_one_family():
    names = preset_names()
    assert len(names) == len(set(names))
    for family in FAMILIES:
        for preset in family.presets():
            assert family_of(preset) is family
    assert {"pi0-tiny", "groot-tiny", "vggt-tiny", "hunyuan3d-tiny", "hunyuan3d-paint-tiny"} <= set(names)


def test_a_directory_of_no_family_names_what_each_expects(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="weights.bin.*hunyuan3d-2: a Hunyuan3D-2.*vggt: a VGGT checkpoint"):
        family_of(tmp_path)


# Tiny presets at the cheapest settings that still run every stage once: one timed run, no warm-up.
BENCH_CASES = {
    "vggt-tiny": (["--views", "2"], "vggt", 2, 1),
    "hunyuan3d-tiny": (["--num-steps", "2", "--octree-resolution", "16"], "hunyuan3d-2", 1, 2),
}


@pytest.mark.parametrize("preset", list(BENCH_CASES))
def test_bench_writes_the_shared_result_fields_for_every_family(capsys, tmp_path, preset):
    options, family, views, steps = BENCH_CASES[preset]
    code, out, err = run_cli(capsys, "bench", "--model", preset, *options, "--runs", "1", "--warmup", "0",
                             "--no-stages", "--no-progress", "--out-dir", str(tmp_path))  # fmt: skip
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert set(RESULT_KEYS) <= set(record)
    assert (record["model"], record["preset"], record["batch"], record["views"], record["steps"]) == (
        family, preset, 1, views, steps
    )
    assert record["runs"] == 1 and record["mean_ms"] > 0 and record["aten_ops_per_call"] > 0
    assert record["random_weights"] is True and record["measured_call"]
    assert f"{family}/{preset}" in out


def test_run_reconstructs_the_sample_scene(capsys):
    code, out, err = run_cli(capsys, "run", "--model", "vggt-tiny", "--no-warm-call", "--no-progress")
    assert code == 0, err
    assert "RANDOM WEIGHTS" in out
    assert "depth:       shape (4, 42, 56)" in out  # the bundled scene's 4 frames, cropped to 56 wide
    assert "points:      shape (4, 42, 56, 3)" in out
    assert "stages aggregator" in out


def test_profile_writes_the_summary_for_a_non_policy_family(capsys, tmp_path):
    code, out, err = run_cli(capsys, "profile", "--model", "vggt-tiny", "--views", "1", "--warmup", "0", "--calls",
                             "1", "--no-progress", "--out-dir", str(tmp_path))  # fmt: skip
    assert code == 0, err
    (summary,) = tmp_path.glob("*/summary.json")
    assert summary.parent.name == "vggt-tiny_reference_eager_float32_b1_v1"
    assert json.loads(summary.read_text())["aten_ops_per_call"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--model", "vggt-tiny", "--octree-resolution", "32"], "--octree-resolution applies to hunyuan3d-2"),
        (["info", "--model", "hunyuan3d-tiny", "--quant", "w8a8"], "--quant w8a8: hunyuan3d-2 models declare no"),
        (["run", "--model", "vggt-tiny", "--embodiment", "gr1"], "--embodiment applies to policies"),
        (["run", "--model", "pi0-tiny", "--dtype", "float16"], "--dtype float16: pi0 models run in float32, bfloat16"),
        (["bench", "--model", "hunyuan3d-tiny", "--batch", "2"], "--batch / --views"),
        (["bench", "--model", "vggt-tiny", "--num-steps", "3"], "--num-steps: VGGT has no denoising steps"),
    ],
)
def test_an_option_the_family_does_not_read_is_an_error_naming_it(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv, "--no-progress")
    assert code == 2
    assert message in err and "Traceback" not in err


def test_info_describes_the_texture_models(capsys):
    code, out, err = run_cli(capsys, "info", "--model", "hunyuan3d-paint-tiny", "--no-progress")
    assert code == 0, err
    assert "model:       hunyuan3d-paint-tiny (family hunyuan3d-paint), preset hunyuan3d-paint-tiny" in out
    assert "delight hunyuan3d-delight-tiny" in out and "views:       6 of 32x32" in out
    parameters = next(line for line in out.splitlines() if line.startswith("parameters:"))
    assert int(parameters.split("(")[1].rstrip(")").replace(",", "")) > 0


@pytest.mark.parametrize("preset", ["pi0-tiny", "vggt-tiny"])
def test_quant_reaches_every_family_that_declares_a_plan(capsys, preset):
    code, out, err = run_cli(capsys, "info", "--model", preset, "--quant", "w8a8", "--no-progress")
    assert code == 0, err
    assert "runtime:     backend reference (w8a8)," in out
