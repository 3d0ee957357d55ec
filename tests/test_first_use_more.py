"""First use, continued: devices that this machine lacks, evaluation against our own server, every missing extra
named before any work, progress on a terminal only, results outside the package's folders, intra-op threads by model
size, one-line argument errors with "did you mean", and the smaller messages a new user meets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied_accel import cli

torch.set_num_threads(1)


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------------------------
# Devices: one line and exit code 2
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device, words", [("cuda", "not available"), ("cuda:1", "not available"),
                                           ("npu", "torch_npu"), ("foo", "expected e.g.")])  # fmt: skip
def test_train_on_a_device_this_machine_lacks_is_one_line(capsys, tmp_path, device, words):
    code, out, err = run_cli(capsys, "train", "--device", device, "--out", tmp_path / "run")
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("embodied-accel train: error: device:") and words in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()  # checked before the sample data is written


def test_the_available_device_check_passes_the_cpu():
    from embodied_accel.platform import available_device

    assert available_device("cpu:0") == torch.device("cpu")
    with pytest.raises(ValueError, match="device: expected"):
        available_device("meta")


# ---------------------------------------------------------------------------------------------------------------
# eval libero --server: the cameras the server reads
# ---------------------------------------------------------------------------------------------------------------


def test_eval_against_our_own_server_sends_the_cameras_its_metadata_names():
    from embodied_accel import load_policy
    from embodied_accel.cli.eval import server_cameras
    from embodied_accel.eval.libero import LEROBOT_LIBERO_CAMERAS, ObservationKeys, observation_for
    from embodied_accel.eval.rollout import Episode, RemotePolicy
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = load_policy("pi05-tiny", progress=False)
    config = ServeConfig(host="127.0.0.1", port=0, num_steps=1)  # the keymap serve uses by default
    with ServerThread(PolicyServer(policy, config)) as running:
        remote = RemotePolicy(running.url, 1)
        try:
            cameras = server_cameras(remote.metadata, None, LEROBOT_LIBERO_CAMERAS, running.url)
            assert cameras == tuple(policy.io.image_keys[:2]) and cameras != LEROBOT_LIBERO_CAMERAS
            keys = ObservationKeys(cameras[0], cameras[1], remote.metadata["state_key"])
            rng = np.random.default_rng(0)
            raw = {"agentview": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
                   "wrist": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
                   "state": rng.standard_normal(8).astype(np.float32)}  # fmt: skip
            episode = Episode(number=0, task=0, init_state=0, seed=0)
            (actions,) = remote([observation_for(keys, ["pick it up"])(raw, episode)], [0])
            assert actions.shape[0] == remote.metadata["action_horizon"] and np.isfinite(actions).all()
        finally:
            remote.close()


def test_camera_keys_the_server_does_not_read_name_both_sides():
    from embodied_accel.cli.eval import server_cameras

    meta = {"cameras": ["observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb"]}
    with pytest.raises(ValueError) as info:
        server_cameras(meta, ("observation.images.image",), ("a", "b"), "ws://box:8000")
    text = str(info.value)
    assert "\n" not in text and "observation.images.base_0_rgb" in text and "observation.images.image" in text
    assert server_cameras({}, None, ("a", "b"), "ws://x") == ("a", "b")  # an openpi server that names none


# ---------------------------------------------------------------------------------------------------------------
# Extras: every missing one named at once, before any work
# ---------------------------------------------------------------------------------------------------------------


def _bare_install(monkeypatch, *modules):
    import sys

    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # as if its package were not installed


@pytest.mark.parametrize("argv, extras", [
    (["texture"], "[texture]"),
    (["shape", "--texture"], "[shape,texture]"),
    (["shape"], "[shape]"),
])  # fmt: skip
def test_a_bare_install_names_every_extra_a_command_needs_before_any_work(capsys, monkeypatch, tmp_path, argv, extras):
    from embodied_accel.pipelines import shape, texture

    def must_not_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the extras were checked")

    monkeypatch.setattr(texture, "load_texture_pipeline", must_not_load)
    monkeypatch.setattr(shape, "load_shape_pipeline", must_not_load)
    _bare_install(monkeypatch, "PIL", "cv2", "yaml", "xatlas", "fast_simplification")
    code, out, err = run_cli(capsys, *argv, "-o", tmp_path / "out.glb", "--no-progress")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"pip install 'embodied-accel{extras}'" in err and "pillow" in err


def test_only_the_missing_extra_is_named(monkeypatch):
    from embodied_accel.extras import missing_extras, require_extras

    _bare_install(monkeypatch, "xatlas")
    assert missing_extras("shape", "texture") == {"texture": ["xatlas"]}
    with pytest.raises(ImportError, match=r"needs xatlas \(not installed\): pip install 'embodied-accel\[texture\]'$"):
        require_extras("shape --texture", "shape", "texture")


# ---------------------------------------------------------------------------------------------------------------
# Results: under the current directory's results/, never the package's committed folders
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, dest, default", [
    (["bench"], "out_dir", "results"),
    (["profile"], "out_dir", "results/profiles"),
    (["loadtest"], "out_dir", "results"),
    (["reconstruct"], "output", "results/scene.ply"),
    (["shape"], "output", "results/mesh.glb"),
    (["texture"], "output", "results/textured.glb"),
])  # fmt: skip
def test_every_command_writes_under_results_by_default(argv, dest, default):
    from pathlib import Path

    assert getattr(cli.build_parser().parse_args(argv), dest) == Path(default)


def test_a_result_written_from_a_checkout_leaves_its_committed_results_alone(monkeypatch, tmp_path):
    from pathlib import Path

    from test_bench_harness import _record

    from embodied_accel.bench import harness

    committed = Path(__file__).resolve().parents[1] / "bench" / "results"
    before = sorted(committed.iterdir()) if committed.is_dir() else []
    monkeypatch.chdir(tmp_path)
    path = harness.write_result(_record())  # the default bench (and loadtest) write to
    assert path.resolve().parent == tmp_path / "results"
    assert (sorted(committed.iterdir()) if committed.is_dir() else []) == before


# ---------------------------------------------------------------------------------------------------------------
# Progress: on a terminal, quiet in logs and with --no-progress
# ---------------------------------------------------------------------------------------------------------------


class _Terminal:
    """stderr as an interactive terminal would be: what is written is kept."""

    def __init__(self):
        import io

        self.buffer = io.StringIO()

    def isatty(self):
        return True

    def write(self, text):
        return self.buffer.write(text)

    def flush(self):
        pass


@pytest.mark.parametrize("flags, shown", [((), True), (("--no-progress",), False)])
def test_loadtest_shows_its_requests_on_a_terminal_only(capsys, monkeypatch, flags, shown):
    import sys

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = cli.main(["loadtest", "--clients", "1", "--requests", "2", "--warmup", "0", "--no-write", *flags])
    assert code == 0
    text = terminal.buffer.getvalue()
    assert "1 client(s) x 2 request(s)" in text  # the phase line, in logs too
    assert ("loadtest requests" in text and "/2 [" in text) == shown  # the bar and its total (redraws are throttled)
    assert ("building the policy" in text) == shown


def test_progress_is_quiet_in_logs(capsys):
    from embodied_accel.progress import show_progress, working

    assert not show_progress() and not show_progress(no_progress=True)  # stderr captured: not a terminal
    with working("building", show_progress()):
        pass
    assert capsys.readouterr().err == ""


def test_the_seconds_counter_redraws_and_clears_its_line(monkeypatch):
    import sys
    import time

    from embodied_accel.progress import working

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with working("building pi05", True, interval_s=0.05):
        time.sleep(0.2)
    text = terminal.buffer.getvalue()
    assert text.count("building pi05: 00:00") >= 2 and text.endswith("\r")


# ---------------------------------------------------------------------------------------------------------------
# Intra-op threads by model size on the CPU
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_small_model_runs_on_one_thread_and_says_how_to_change_it(restore_threads):
    from embodied_accel.runtime.threads import SMALL_MODEL_PARAMETERS, choose_cpu_threads

    torch.set_num_threads(2)
    line = choose_cpu_threads("cpu", 314_368, environ={})
    assert torch.get_num_threads() == 1 and "--threads N" in line and "0.314 M parameters" in line
    torch.set_num_threads(2)
    assert "torch's default" in choose_cpu_threads("cpu", SMALL_MODEL_PARAMETERS, environ={})
    assert torch.get_num_threads() == 2  # a large model keeps torch's default
    assert "OMP_NUM_THREADS" in choose_cpu_threads("cpu", 10, environ={"OMP_NUM_THREADS": "2"})
    assert torch.get_num_threads() == 2  # the user's environment is kept
    assert choose_cpu_threads("cpu", 10, requested=3, environ={}) == "threads:     3 intra-op (--threads)"
    assert torch.get_num_threads() == 3
    assert choose_cpu_threads("cuda:0", 10, requested=3, environ={}) is None


def test_run_prints_the_thread_choice_and_takes_threads(capsys, restore_threads):
    code, out, _ = run_cli(capsys, "run", "--threads", "2", "--no-warm-call", "--no-progress")
    assert code == 0 and "threads:     2 intra-op (--threads)" in out and torch.get_num_threads() == 2


# ---------------------------------------------------------------------------------------------------------------
# export: defaults, the paint models, random weights in the manifest
# ---------------------------------------------------------------------------------------------------------------


def test_export_runs_without_arguments_and_says_when_the_weights_are_random(capsys, monkeypatch):
    from pathlib import Path
    from types import SimpleNamespace

    import embodied_accel.export as export

    calls = []

    def fake_export(source, output, **kwargs):  # the export itself: test_export_*.py
        calls.append((source, Path(output)))
        return SimpleNamespace(graphs=[], model=source, family="pi0", opset=18, random_weights=True)

    monkeypatch.setattr(export, "export_model", fake_export)
    code, out, _ = run_cli(capsys, "export")
    assert code == 0 and calls == [("pi0-tiny", Path("results") / "export" / "pi0-tiny")]
    assert "note: pi0-tiny has seeded random weights" in out


def test_exporting_a_paint_model_says_it_has_no_export(capsys):
    code, _, err = run_cli(capsys, "export", "--model", "hunyuan3d-paint-tiny")
    assert code == 2 and "Hunyuan3D-Paint (texture) model, which has no ONNX export" in err
    assert "neither a checkpoint directory nor a preset" not in err


def test_a_manifest_keeps_random_weights_and_reads_exports_that_lack_it(tmp_path):
    from embodied_accel.deploy.manifest import GraphSpec, Manifest, ManifestError, TensorSpec

    spec = TensorSpec("x", (1, 2), "float32")
    graph = GraphSpec("g", "", "g.onnx", (spec,), (spec,))
    manifest = Manifest("vggt", "vggt-tiny", "vggt-tiny", "float32", 18, (graph,), random_weights=True)
    data = manifest.to_dict()
    assert Manifest.from_dict(data).random_weights is True
    assert Manifest.from_dict({k: v for k, v in data.items() if k != "random_weights"}).random_weights is None
    with pytest.raises(ManifestError, match="random_weights: expected true or false"):
        Manifest.from_dict({**data, "random_weights": "yes"})


# ---------------------------------------------------------------------------------------------------------------
# Argument errors: one line, with "did you mean"
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["run", "--model", "pi0-tyny"], "embodied-accel run: error: argument --model: invalid choice: 'pi0-tyny' "
                                     "(did you mean pi0-tiny or pi05-tiny?) (try embodied-accel run --help)"),
    (["rnu"], "embodied-accel: error: argument COMMAND: invalid choice: 'rnu' (did you mean run?) "
              "(try embodied-accel --help)"),
    (["bench", "--rusn", "3"], "embodied-accel bench: error: unrecognized arguments: --rusn 3 (did you mean --runs?) "
                               "(try embodied-accel bench --help)"),
    (["eval"], "embodied-accel eval: error: the following arguments are required: BENCHMARK "
               "(try embodied-accel eval --help)"),
    (["eval", "libero", "--episodse", "2"], "embodied-accel eval libero: error: unrecognized arguments: --episodse 2 "
                                            "(did you mean --episodes?) (try embodied-accel eval libero --help)"),
    (["reconstruct", "--model", "vggt-tiyn"], "(did you mean vggt-tiny or vggt?)"),
])  # fmt: skip
def test_an_argument_error_is_one_line_that_says_what_was_meant(capsys, argv, expected):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and "usage:" not in err
    assert expected in err


def test_an_unknown_choice_with_nothing_close_keeps_the_choices(capsys):
    code, _, err = run_cli(capsys, "shape", "--decoding", "zzz")
    assert code == 2 and "choose from 'hierarchical', 'dense'" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------------------------
# Smaller messages and defaults
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, name, words", [("--observation", "obs.npz", "not a .npz archive"),
                                               ("--noise", "noise.npy", "not a .npy array")])  # fmt: skip
def test_a_text_file_given_as_numpy_names_the_file_and_the_format(capsys, tmp_path, flag, name, words):
    path = tmp_path / name
    path.write_text("hello\n")
    code, _, err = run_cli(capsys, "run", flag, path)
    assert code == 2 and err.count("\n") == 1 and str(path) in err and words in err
    assert "pickle" not in err


def test_eval_libero_has_a_default_suite_and_the_help_says_what_eval_needs(capsys):
    assert cli.build_parser().parse_args(["eval", "libero"]).suite == "libero_spatial"
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "eval names its benchmark: eval libero" in " ".join(out.split())


def test_the_readme_lists_every_command_and_how_to_install_openpi_client():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    for command in ("run", "serve", "train", "eval libero", "reconstruct", "shape", "texture", "export"):
        assert f"| `embodied-accel {command}`" in readme, command
    for command in ("info", "bench", "profile", "loadtest"):  # in the README's rows of several commands
        assert f" / `{command}`" in readme, command
    commands = (repo / "docs" / "commands.md").read_text(encoding="utf-8")
    for command in ("run", "info", "bench", "profile", "serve", "train", "eval libero", "reconstruct", "shape",
                    "texture", "export"):  # fmt: skip
        assert f"| `embodied-accel {command}`" in commands, command
    assert "pip install --no-deps openpi-client==0.1.2" in (repo / "docs" / "serving.md").read_text(encoding="utf-8")
