"""The LeRobot plugin (``integrations/lerobot_policy_embodied_accel``) inside LeRobot 0.6.1 itself: parity with
LeRobot's own pi0 / pi0.5 policies on the committed fixture checkpoints, ``lerobot-eval`` on PushT with our policy
type, LeRobot's async-inference server driven by its own gRPC stubs, and the errors of wrong directories.

LeRobot needs Python >= 3.12 and its own torch, so it lives in its own environment (``.ci/run`` builds it:
lerobot[pi,async,pusht]==0.6.1, embodied-accel and the plugin); these tests run
``tools/lerobot_reference/plugin_checks.py`` (every check in one process, so LeRobot is imported once) and
``lerobot-eval`` with the interpreter named by ``EMBODIED_ACCEL_LEROBOT_PYTHON``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECKS = REPO / "tools" / "lerobot_reference" / "plugin_checks.py"
LEROBOT_PYTHON = os.environ.get("EMBODIED_ACCEL_LEROBOT_PYTHON")
#: The parity tolerance: relative error (max |ours - LeRobot's| / max |LeRobot's|) of the robot actions, fp32 CPU.
TOLERANCE = 1e-5

pytestmark = pytest.mark.skipif(
    not LEROBOT_PYTHON or not os.access(LEROBOT_PYTHON, os.X_OK),
    reason="needs a Python with lerobot==0.6.1, embodied-accel and lerobot_policy_embodied_accel installed, named by "
    "EMBODIED_ACCEL_LEROBOT_PYTHON (.ci/run builds .venv-lerobot)",
)


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)  # the LeRobot environment imports its own installs (embodied-accel is editable)
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    )
    return done


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("lerobot_plugin")
    _run([LEROBOT_PYTHON, str(CHECKS), "parity", "pusht-checkpoint", "async", "errors", "--work", str(work)], cwd=REPO)
    return json.loads((work / "checks.json").read_text())


def test_plugin_actions_equal_lerobots_own_policies(checks):
    results = checks["parity"]
    for kind in ("pi0", "pi05"):
        result = results[kind]
        assert result["type"] == f"embodied_{kind}"
        assert result["engine"] == "embodied_accel.policies.pi0"  # our engine ran, not LeRobot's model
        assert result["same_preprocessed_batch"]  # LeRobot's own pre-processor, loaded from each directory
        assert result["chunk_shape"] == [2, 50, 7] and result["select_action_shape"] == [2, 7]
        assert result["actions_abs_max"] > 0.1  # actions of real size, not zeros
        assert result["chunk_relative_error"] <= TOLERANCE, result
        assert result["select_action_relative_error"] <= TOLERANCE, result
        assert result["select_action_steps_differ"] and result["reset_restarts_chunk"]
    # the prompts were really tokenized, and pi0.5's carries the discretized state: more tokens than the task alone
    assert min(results["pi0"]["tokens_valid"]) > 3
    assert min(results["pi05"]["tokens_valid"]) > max(results["pi0"]["tokens_valid"])


def test_lerobot_eval_runs_our_policy_type_on_pusht(checks, tmp_path):
    lerobot_eval = str(Path(LEROBOT_PYTHON).parent / "lerobot-eval")
    out = tmp_path / "eval"
    done = _run(
        [lerobot_eval, f"--policy.path={checks['pusht-checkpoint']['pi0']['policy_dir']}", "--env.type=pusht",
         "--env.episode_length=12", "--eval.n_episodes=1", "--eval.batch_size=1", "--policy.device=cpu",
         f"--output_dir={out}"],
        cwd=tmp_path,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert "using 'pusht_embodied_pi0' as job name" in log  # LeRobot built the policy from our type
    assert "no tokenizer found" not in log  # LeRobot's pre-processor tokenizes; the engine does not look for one
    info = json.loads((out / "eval_info.json").read_text())
    assert info["overall"]["n_episodes"] == 1
    assert len(list((out / "videos").rglob("*.mp4"))) == 1


def test_lerobot_async_server_refuses_third_party_policy_types(checks):
    result = checks["async"]
    assert result["ready"] and result["ready_after"]
    # LeRobot 0.6.1's server checks the type against its own list (act, smolvla, diffusion, tdmpc, vqbet, pi0,
    # pi05, groot) before loading anything, so no installed plugin type can be served by it
    assert result["send_policy_instructions"] == "refused"
    assert "Policy type embodied_pi0 not supported" in result["details"], result


def test_wrong_directories_and_missing_checkpoints_get_one_clear_error(checks):
    found = checks["errors"]
    assert found["wrap_exit_code"] == 2
    assert found["wrong_type"].endswith(
        "'type' is 'embodied_pi05', expected 'embodied_pi0' (that policy type reads this directory)"
    )
    assert found["no_checkpoint"].startswith("checkpoint: embodied_pi0 runs a LeRobot pi0 checkpoint")
    assert found["missing_checkpoint"].endswith("is not a directory (expected a LeRobot checkpoint directory)")
