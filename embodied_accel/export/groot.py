"""GR00T N1.6 and N1.7 for export: the backbone, the action head's per-call context, and one action-head step.

* ``backbone``: prompt ids (left-padded), validity and images (N1.6: image slots and token positions; N1.7: the
  patches at the bucket's fixed grids) → features ``[B, L, D]``;
* ``action_context``: features, ids, validity, normalized state → state tokens and every cross-attention block's
  K/V ``[blocks, 2, B, H, L, Dh]``, once per call;
* ``action_step``: ``x_t``, step index, state tokens, cross K/V, prompt → one flow step's velocity (per-step AdaLN
  and time-feature tables).

The bucket is the one a sample observation of the embodiment pads to; the manifest records it, the loop
(``x ← x + v / steps`` from t = 0) and the embodiment's keys and statistics.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.groot.model import GrootModel, build_buffers
from ..models.groot.n17_model import GrootN17Model, build_n17_buffers
from ..nn.dit import DiTModulation
from .engine import FamilyExport, GraphExport
from .tables import StepTables

PARTS = ("backbone", "action_context", "action_step")


class BackboneGraph(nn.Module):
    def __init__(self, model: GrootModel, buffers):
        super().__init__()
        self.model, self.static = model, buffers

    def forward(self, input_ids, valid, image_positions, *images) -> torch.Tensor:
        return self.model.backbone(images, input_ids, valid, image_positions, self.static)


class N17BackboneGraph(nn.Module):
    def __init__(self, model: GrootN17Model, buffers):
        super().__init__()
        self.model, self.static = model, buffers

    def forward(self, input_ids, valid, pixel_values) -> torch.Tensor:
        return self.model.backbone(input_ids, valid, pixel_values, self.static)


class ActionContextGraph(nn.Module):
    def __init__(self, model: GrootModel, buffers):
        super().__init__()
        self.model, self.static = model, buffers

    def forward(self, features, input_ids, valid, state):
        cross_kv = torch.empty_like(self.static.cross_kv)  # written by the one cross-K/V GEMM inside the graph
        buffers = dataclasses.replace(self.static, cross_kv=cross_kv)
        context = self.model.flow_context(features, input_ids, valid, state, buffers)
        return context.state_tokens, torch.stack([torch.stack(kv) for kv in context.cross_kv])


class ActionStepGraph(nn.Module):
    def __init__(self, model: GrootModel, buffers):
        super().__init__()
        self.model, self.static = model, buffers
        modulation, time_bias = buffers.modulation, buffers.action_time_bias
        self.steps = StepTables(
            [(modulation.blocks[s], modulation.output[s], time_bias[s]) for s in range(len(time_bias))]
        )

    def forward(self, x_t, step, state_tokens, cross_kv, input_ids, valid) -> torch.Tensor:
        blocks, output, time_bias = self.steps.select(step)
        buffers = dataclasses.replace(
            self.static, modulation=DiTModulation((blocks,), (output,)), action_time_bias=(time_bias,)
        )
        text_mask, image_mask = self.model.attention_masks(input_ids, valid, state_tokens.shape[1])
        cross = [(cross_kv[i, 0], cross_kv[i, 1]) for i in range(cross_kv.shape[0])]
        return self.model.velocity(x_t, state_tokens, cross, text_mask, image_mask, 0, buffers)


def _plain(value: Any) -> Any:
    """A dataclass / numpy nesting as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def describe(policy, *, batch: int = 1, parts: tuple[str, ...] = PARTS, num_steps: int | None = None) -> FamilyExport:
    """The export of a loaded GR00T policy (reference backend) at the bucket of its sample observation, ``batch``
    rows of it."""
    model = policy.model
    cfg = model.config
    inputs = policy.prepare([policy.sample_observation(seed=0)] * batch, num_steps)
    bucket = inputs.bucket
    n17 = isinstance(model, GrootN17Model)
    buffers = build_n17_buffers(model, bucket, "cpu") if n17 else build_buffers(model, bucket, "cpu")
    generator = torch.Generator().manual_seed(0)
    x_t = torch.randn(batch, cfg.action_horizon, cfg.max_action_dim, generator=generator)
    step = torch.tensor([min(1, bucket.num_steps - 1)], dtype=torch.int64)
    label = f"b{batch}"
    prompt = (("input_ids", inputs.input_ids), ("valid", inputs.valid))
    if n17:
        backbone = N17BackboneGraph(model, buffers)
        backbone_inputs = (*prompt, ("pixel_values", inputs.pixel_values))
        bucket_info = {"version": "n1.7", "image_grid_thw": [list(g) for g in bucket.image_grid_thw]}
    else:
        backbone = BackboneGraph(model, buffers)
        image_inputs = tuple((f"image_{i}", image) for i, image in enumerate(inputs.images))
        backbone_inputs = (*prompt, ("image_positions", inputs.image_positions), *image_inputs)
        bucket_info = {"image_grids": [list(g) for g in bucket.image_grids]}
    context = ActionContextGraph(model, buffers)
    with torch.no_grad():
        features = backbone(*(value for _, value in backbone_inputs))
        state_tokens, cross_kv = context(features, inputs.input_ids, inputs.valid, inputs.state)
    graphs = {
        "backbone": lambda: GraphExport("backbone", label, backbone, backbone_inputs, ("features",)),
        "action_context": lambda: GraphExport(
            "action_context", label, context, (("features", features), *prompt, ("state", inputs.state)),
            ("state_tokens", "cross_kv"),
        ),
        "action_step": lambda: GraphExport(
            "action_step", label, ActionStepGraph(model, buffers),
            (("x_t", x_t), ("step", step), ("state_tokens", state_tokens), ("cross_kv", cross_kv), *prompt),
            ("velocity",),
        ),
    }  # fmt: skip
    spec = policy.processor.spec
    call = {
        "kind": "flow_model",
        "batch": batch,
        "loop": {"kind": "euler", "steps": bucket.num_steps, "dt": 1.0 / bucket.num_steps, "start_time": 0.0},
        "noise_shape": [cfg.action_horizon, cfg.max_action_dim],
        "bucket": {**bucket_info, "seq_len": bucket.seq_len, "state_horizon": bucket.state_horizon,
                   "image_token_id": cfg.image_token_id},  # fmt: skip
        "embodiment": _plain(spec),
    }
    return FamilyExport.of("groot", cfg.name, policy.source, model.compute_dtype, graphs, parts, call)


__all__ = ["PARTS", "describe"]
