"""W8A8 and FP8 on the policies: ``quant="w8a8"`` / ``"fp8"`` replaces exactly the family plan's linear layers by
:class:`W8A8Linear` / :class:`FP8Linear`, and the action chunk stays within a bound derived from the int8 / E4M3
arithmetic of the fp32 one; a bad ``quant`` value is an error naming the setting."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied_accel.models.groot.plans import W8A8_PLAN as GROOT_PLAN
from embodied_accel.models.pi0.plans import W8A8_PLAN as PI0_PLAN
from embodied_accel.nn.linear import Linear
from embodied_accel.policies.groot import load_groot_policy
from embodied_accel.policies.pi0 import load_pi0_policy
from embodied_accel.quant import FP8Linear, W8A8Linear, check_quant

torch.set_num_threads(1)

SAMPLE = Path(__file__).resolve().parents[1] / "embodied_accel" / "data" / "sample_observation.npz"


def pi0_observation(policy):
    with np.load(SAMPLE, allow_pickle=False) as data:
        observation = {key: str(v) if v.ndim == 0 and v.dtype.kind in "US" else v for key, v in data.items()}
    observation.pop("observation.language.tokens")  # the tiny presets bring a tokenizer: take the text
    return observation


def groot_observation(policy):
    return policy.sample_observation(seed=0, height=64, width=64)


CASES = {
    "pi0-tiny": (load_pi0_policy, pi0_observation, PI0_PLAN),
    "groot-tiny": (load_groot_policy, groot_observation, GROOT_PLAN),
}


def int8_error_bound(layers: int) -> float:
    """Relative L2 error of the output allowed after ``layers`` W8A8 layers.

    Symmetric int8 rounds each element of an operand (a token row of the activations, an output column of the
    weights) to a step of ``max / 127``: a uniform error of RMS ``step / sqrt(12)``. For rows whose largest element is
    at most 4x their RMS (activations after a norm, the seeded Gaussian-like weights), one operand's relative RMS
    error is at most ``4 / (127 sqrt(12))`` (0.0091); a layer quantizes two independent operands (x sqrt(2)); the
    layers' independent errors add in quadrature along the network (x sqrt(layers)). The residual stream and the
    float layers only dilute it.
    """
    per_operand = 4 / (127 * math.sqrt(12))
    return per_operand * math.sqrt(2) * math.sqrt(layers)


def fp8_error_bound(layers: int) -> float:
    """Relative L2 error of the output allowed after ``layers`` FP8 (E4M3) layers.

    E4M3 keeps 3 mantissa bits: an element rounds to a spacing of at most 2⁻³ of its magnitude (just above a power
    of two), a uniform error of relative RMS at most ``2⁻³ / sqrt(12)`` (0.036) whatever the row's range (the scale
    maps the row's largest element to 448, so no element of a norm's output falls to E4M3's subnormals); two operands
    per layer (x sqrt(2)), the layers' errors in quadrature (x sqrt(layers)).
    """
    return 2**-3 / math.sqrt(12) * math.sqrt(2) * math.sqrt(layers)


QUANT_LAYERS = {"w8a8": (W8A8Linear, int8_error_bound), "fp8": (FP8Linear, fp8_error_bound)}


@pytest.mark.parametrize("quant", list(QUANT_LAYERS))
@pytest.mark.parametrize("preset", list(CASES))
def test_quantized_policy_quantizes_the_plan_and_stays_close(preset, quant):
    load, observe, plan = CASES[preset]
    kwargs = dict(backend="reference", dtype="float32", device="cpu", progress=False)
    reference_policy = load(preset, **kwargs)
    observation = observe(reference_policy)
    reference = np.asarray(reference_policy.infer_batch([observation], seed=0)["actions"], dtype=np.float64)
    planned = {
        name for name, module in reference_policy.model.named_modules()
        if isinstance(module, Linear) and any(re.fullmatch(p, name) for p in plan["include"])
    }  # fmt: skip
    del reference_policy

    layer_type, error_bound = QUANT_LAYERS[quant]
    policy = load(preset, quant=quant, **kwargs)
    quantized_layers = {name for name, module in policy.model.named_modules() if isinstance(module, layer_type)}
    assert quantized_layers == planned and planned
    actions = np.asarray(policy.infer_batch([observation], seed=0)["actions"], dtype=np.float64)
    assert np.isfinite(actions).all() and actions.shape == reference.shape
    relative = np.linalg.norm(actions - reference) / np.linalg.norm(reference)
    assert 0 < relative < error_bound(len(quantized_layers)), relative


def test_pi0_plan_names_every_gemma_projection():
    """4 linear layers (qkv, o, gate_up, down) per layer of the VLM and of the action expert."""
    policy = load_pi0_policy("pi05-tiny", quant="w8a8", backend="reference", device="cpu", progress=False)
    config = policy.model.config
    layers = sum(isinstance(m, W8A8Linear) for m in policy.model.modules())
    assert layers == 4 * (config.vlm.depth + config.expert.depth)


@pytest.mark.parametrize("load", [load_pi0_policy, load_groot_policy])
def test_bad_quant_value_names_the_setting(load):
    with pytest.raises(ValueError, match=r"quant: expected one of none, w8a8, fp8, got 'int4'"):
        load("pi0-tiny" if load is load_pi0_policy else "groot-tiny", quant="int4", progress=False)
    assert check_quant("w8a8") == "w8a8"


def test_run_quant_flag_loads_the_quantized_policy(capsys, tmp_path):
    """``embodied-accel run --quant w8a8`` gives the actions of ``load_pi0_policy(..., quant="w8a8")``."""
    from embodied_accel import cli

    noise = np.random.default_rng(3).standard_normal((50, 32)).astype(np.float32)
    np.save(tmp_path / "noise.npy", noise)
    argv = ["run", "--model", "pi0-tiny", "--backend", "reference", "--noise", str(tmp_path / "noise.npy")]
    assert cli.main([*argv, "--quant", "w8a8", "--output", str(tmp_path / "w8a8.npy")]) == 0
    assert cli.main([*argv, "--output", str(tmp_path / "fp32.npy")]) == 0
    capsys.readouterr()
    policy = load_pi0_policy("pi0-tiny", quant="w8a8", backend="reference", device="cpu", progress=False)
    observation, _ = cli.select_instruction(policy, cli.load_observation(cli.SAMPLE_OBSERVATION))
    expected = policy.infer(observation, noise=noise)["actions"]
    np.testing.assert_array_equal(np.load(tmp_path / "w8a8.npy"), expected)
    assert not np.array_equal(np.load(tmp_path / "fp32.npy"), expected)
