"""Our pi0 / pi0.5 parameters back in LeRobot's layout: :mod:`.weights`' key table read backwards.

Un-transpose, split fused q/k/v and gate/up, unfold Gemma's ``1 + w``, un-scale the token embedding, for weights
(a checkpoint LeRobot and :func:`~embodied_accel.load_policy` read) and gradients (every load transform is linear,
so a gradient goes back through its adjoint: ``s · dL/dE'`` for the scaled embedding, unchanged for ``1 + w``).
Round trips are exact for transposes and splits, for ``(1 + w) - 1`` with scales ≥ 1/2 and for the embedding when
``sqrt(width)`` is a power of two; at full size the embedding may move by one fp32 ulp.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..loading import Rule
from .weights import IGNORED_KEYS, weight_rules

#: The key prefix LeRobot's ``save_pretrained`` writes (our tables name keys without it).
LEROBOT_PREFIX = "model."


def _split_sizes(rule: Rule) -> list[int]:
    return [shape[0] for shape in rule.source_shapes]


def _to_lerobot(rule: Rule, value: torch.Tensor, gradient: bool) -> list[torch.Tensor]:
    """The LeRobot tensors of one rule from our parameter (or its gradient)."""
    transform = rule.transform
    if transform == "t":
        return [value.t()]
    if transform == "cat_t":
        return list(value.t().split(_split_sizes(rule), dim=0))
    if transform == "cat":
        return list(value.split(_split_sizes(rule), dim=0))
    if transform == "copy":
        return [value]
    if transform == "one_plus":
        return [value if gradient else value - 1.0]
    if transform == "embed_scaled":
        scale = torch.tensor(rule.args[0], dtype=torch.float32).to(value.dtype)
        return [value * scale if gradient else value / scale]
    raise ValueError(f"no inverse for weight transform {transform!r} (target {rule.target})")


def _weight(model, target: str) -> torch.Tensor:
    """Our weight ``target`` as the model computes with it (a parametrized weight, e.g. with LoRA, evaluated)."""
    path, _, name = target.rpartition(".")
    return getattr(model.get_submodule(path) if path else model, name)


def _lerobot_items(model, gradients: bool) -> Iterator[tuple[str, torch.Tensor]]:
    params = dict(model.named_parameters())
    for rule in weight_rules(model.config):
        if gradients:
            value = params[rule.target].grad if rule.target in params else None
        else:
            with torch.no_grad():
                value = _weight(model, rule.target).detach()
        if value is None:
            continue
        for key, tensor, shape in zip(
            rule.sources, _to_lerobot(rule, value, gradients), rule.source_shapes, strict=True
        ):
            if tuple(tensor.shape) != shape:
                raise AssertionError(f"{rule.target} -> {key}: shape {tuple(tensor.shape)}, expected {shape}")
            yield LEROBOT_PREFIX + key, tensor


def lerobot_state_dict(model, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` (a :class:`~.model.Pi0Model`) under its LeRobot key (``model.`` prefixed),
    contiguous, on the CPU, in ``dtype`` (default: each parameter's own). The unused ``lm_head`` matrices are not
    included (see :func:`lm_head_placeholders`)."""
    return {
        key: tensor.to(device="cpu", dtype=dtype or tensor.dtype).contiguous()
        for key, tensor in _lerobot_items(model, gradients=False)
    }


def lerobot_gradients(model) -> dict[str, torch.Tensor]:
    """The gradients ``.grad`` of ``model``'s parameters mapped to LeRobot's tensors (``model.`` prefixed keys);
    parameters without a gradient are left out."""
    return {key: tensor.detach().to("cpu") for key, tensor in _lerobot_items(model, gradients=True)}


def lm_head_placeholders(model, base: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The two ``lm_head`` matrices a LeRobot checkpoint carries (LeRobot loads its checkpoints strictly) though pi0 and
    pi0.5 never use them: the base checkpoint's when given (``base``: LeRobot key → tensor), else PaliGemma's tied
    head (the token embedding) and zeros for the expert's."""
    cfg = model.config
    weights = lerobot_state_dict_entry(model, "embed_tokens")
    tied = weights[0].to(device="cpu", dtype=torch.float32).contiguous()
    fallback = {
        IGNORED_KEYS[0]: tied,
        IGNORED_KEYS[1]: torch.zeros(cfg.vocab_size, cfg.expert.width, dtype=torch.float32),
    }
    base = base or {}
    out = {}
    for key, value in fallback.items():
        given = base.get(LEROBOT_PREFIX + key)
        out[LEROBOT_PREFIX + key] = value if given is None or tuple(given.shape) != tuple(value.shape) else given
    return out


def lerobot_state_dict_entry(model, target: str) -> list[torch.Tensor]:
    """The LeRobot tensor(s) one of our parameters (``target``) stands for."""
    rule = next((r for r in weight_rules(model.config) if r.target == target), None)
    if rule is None:
        raise KeyError(f"{target!r} is not a parameter of {model.config.name}")
    with torch.no_grad():
        param = _weight(model, target).detach()
    return _to_lerobot(rule, param, gradient=False)


__all__ = [
    "LEROBOT_PREFIX",
    "lerobot_gradients",
    "lerobot_state_dict",
    "lerobot_state_dict_entry",
    "lm_head_placeholders",
]
