"""The code stays navigable: from ``load_policy("pi0-tiny")`` to the first matrix multiplication of ``infer`` a
reader follows at most 8 hops, from GR00T's at most 12 (its first GEMM sits in a ``Linear`` module, two frames
deeper; ``tools/call_path.py`` records the path from the real call stacks)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[1] / "tools" / "call_path.py"


def _tool():
    spec = importlib.util.spec_from_file_location("call_path", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("call_path", module)  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pi0_path():
    torch.set_num_threads(1)
    return _tool().call_path("pi0-tiny")


def test_pi0_path_from_load_policy_to_the_first_gemm_is_at_most_8_hops(pi0_path):
    names = [step.name for step in pi0_path]
    assert names[0] == "load_policy" and pi0_path[0].file == "embodied_accel/families/__init__.py"
    assert "load_pi0_policy" in names and "Policy.infer" in names
    assert names[-1] == "SiglipVisionTower.forward"  # the patch embedding: the first GEMM of the call
    hops = len(pi0_path) - 1
    assert hops <= 8, "\n".join(map(str, pi0_path))
    assert len({step.file for step in pi0_path}) <= 6


def test_the_recorder_sees_a_wrapper_added_on_the_path(monkeypatch, pi0_path):
    """A mutation: one more function between the policy and the model lengthens the recorded path."""
    from embodied_accel.models.pi0 import model as model_module

    original = model_module.Pi0Model.sample_actions

    def extra_hop(self, *args, **kwargs):
        return original(self, *args, **kwargs)

    # As if written in the package's model file (the recorder keeps the package's frames only).
    extra_hop.__code__ = extra_hop.__code__.replace(co_filename=model_module.__file__)
    Pi0Model = model_module.Pi0Model
    monkeypatch.setattr(Pi0Model, "sample_actions", extra_hop)
    torch.set_num_threads(1)
    path = _tool().call_path("pi0-tiny")
    assert any(step.name.endswith("extra_hop") for step in path) and len(path) == len(pi0_path) + 1


@pytest.mark.parametrize("preset", ["groot-tiny", "groot-n1.7-tiny"])
def test_groot_path_from_load_policy_to_the_first_gemm_is_at_most_12_hops(preset):
    torch.set_num_threads(1)
    path = _tool().call_path(preset)
    names = [step.name for step in path]
    assert names[:2] == ["load_policy", "load_groot_family_policy"] and "Policy.infer" in names
    assert names[names.index("Policy.infer") + 2] == "BucketedCall.__call__"  # outputs calls the model call itself
    assert names[-2:] == ["Linear.forward", "linear"]  # the vision tower's first projection
    assert len(path) - 1 <= 12, "\n".join(map(str, path))
