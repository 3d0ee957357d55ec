"""Training parity with LeRobot 0.6.1: one forward + backward of ``PI0Policy.forward`` / ``PI05Policy.forward`` at the
tiny config with fixed batch, noise and time (fixtures from tools/lerobot_reference/make_training_fixtures.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES
from safetensors.torch import load_file
from tolerances import pi0_tolerance

from embodied_accel.models.pi0.export import lerobot_gradients
from embodied_accel import load_policy
from embodied_accel.train.forward import training_velocity
from embodied_accel.train.loss import flow_matching_loss, noisy_actions

ANALYTICALLY_ZERO = 1e-6


def velocity_error(config) -> float:
    """The velocity's error bound relative to its scale: a pi0 call's (tests/tolerances.py), with 2 cameras."""
    return pi0_tolerance(config)


def loss_tolerance(config, loss: torch.Tensor, velocity: torch.Tensor) -> torch.Tensor:
    """How far a mean squared error ``mean((v − u)²)`` may move when ``v`` moves by ``δ ≤ ε · max|v|``:
    ``|Δ| ≤ mean(2 |v − u| δ + δ²) ≤ 2 sqrt(loss) δ + δ²`` (Cauchy–Schwarz), per dimension as for the whole."""
    delta = velocity_error(config) * velocity.detach().abs().max()
    return 2 * loss.detach().sqrt() * delta + delta**2


def gradient_tolerance(config) -> float:
    """A gradient's error relative to its norm: the backward pass runs the layers a second time (twice the chain
    of a forward call, as for guided sampling)."""
    return velocity_error(config) * 2**0.5


def _training_step(family: str, checkpoint_layers: bool = False, mask_padding: bool = False):
    directory = FIXTURES / f"{family}_tiny"
    policy = load_policy(str(directory), backend="reference", device="cpu", progress=False)
    model = policy.model.train().requires_grad_(True)
    io, ref = load_file(directory / "io.safetensors"), load_file(directory / "train.safetensors")
    action_dim = ref["actions"].shape[-1]
    actions = F.pad(ref["actions"], (0, model.config.max_action_dim - action_dim))
    x_t, target = noisy_actions(actions, ref["noise"], ref["time"])
    state = io["state"] if family == "pi0" else None
    velocity = training_velocity(
        model, io["images"], io["image_masks"], io["tokens"], io["token_masks"], state, x_t, ref["time"],
        checkpoint_layers=checkpoint_layers,
    )  # fmt: skip
    pad = ref["action_is_pad"] if mask_padding else None
    loss = flow_matching_loss(velocity, target, action_dim, pad)
    loss.loss.backward()
    return model, loss, ref, velocity[..., :action_dim]


@pytest.mark.parity
@pytest.mark.parametrize("family", ["pi0", "pi05"])
@pytest.mark.parametrize("checkpoint_layers", [False, True], ids=["plain", "checkpointed"])
def test_loss_and_gradients_match_lerobot(family, checkpoint_layers):
    model, loss, ref, velocity = _training_step(family, checkpoint_layers)
    assert abs(loss.loss.item() - ref["loss"].item()) <= loss_tolerance(model.config, ref["loss"], velocity)
    per_dim = loss_tolerance(model.config, ref["loss_per_dim"], velocity)
    assert ((loss.per_dim - ref["loss_per_dim"]).abs() <= per_dim).all(), (loss.per_dim, ref["loss_per_dim"], per_dim)

    ours = lerobot_gradients(model)
    theirs = {key.removeprefix("grad."): value for key, value in ref.items() if key.startswith("grad.")}
    assert sorted(ours) == sorted(theirs), "the same parameters receive gradients"
    total = torch.sqrt(sum(value.double().norm() ** 2 for value in theirs.values())).item()
    # The key biases of attention get a gradient that is zero in exact arithmetic (softmax ignores a per-row shift):
    # both sides hold rounding noise there, bounded against the whole gradient instead.
    floor = ANALYTICALLY_ZERO * total
    worst_key, worst = None, 0.0
    for key, value in theirs.items():
        error = (ours[key] - value).norm().item()
        if value.norm().item() <= floor:
            assert error <= floor, f"{key}: {error:.2e} where the gradient is ~0 ({value.norm().item():.2e})"
            continue
        relative = error / value.norm().item()
        worst_key, worst = (key, relative) if relative > worst else (worst_key, worst)
    assert worst <= gradient_tolerance(model.config), f"worst relative gradient error {worst:.2e} ({worst_key})"


def test_padding_mask_leaves_out_steps_past_the_episode():
    """LeRobot averages over every step; with the mask, the last 7 steps of row 1 count for nothing."""
    model, masked, ref, _ = _training_step("pi0", mask_padding=True)
    pad = ref["action_is_pad"]
    assert pad.sum() == 7
    velocity_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert masked.valid_elements.item() == (pad.numel() - 7) * ref["actions"].shape[-1]
    assert abs(masked.loss.item() - ref["loss"].item()) > 1e-4  # the padded steps changed the mean
    assert velocity_grads


def test_bf16_autocast_step_stays_close_to_fp32():
    """The bf16 path (autocast over fp32 weights): K/V, rotary tables and masks follow autocast's dtype; the loss is
    within bf16 rounding of fp32's and every gradient is finite."""
    directory = FIXTURES / "pi05_tiny"
    policy = load_policy(str(directory), backend="reference", device="cpu", progress=False)
    model = policy.model.train().requires_grad_(True)
    io, ref = load_file(directory / "io.safetensors"), load_file(directory / "train.safetensors")
    actions = F.pad(ref["actions"], (0, model.config.max_action_dim - ref["actions"].shape[-1]))
    x_t, target = noisy_actions(actions, ref["noise"], ref["time"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        velocity = training_velocity(
            model, io["images"], io["image_masks"], io["tokens"], io["token_masks"], None, x_t, ref["time"],
            checkpoint_layers=True,
        )  # fmt: skip
    assert velocity.dtype == torch.float32
    loss = flow_matching_loss(velocity, target, ref["actions"].shape[-1])
    loss.loss.backward()
    assert abs(loss.loss.item() - ref["loss"].item()) <= 0.02 * ref["loss"].item()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())
