"""Experiment: the DiT cache on pi0's / pi0.5's action expert (its denoising loop is a flow-matching DiT too).

Declares a :class:`~embodied_accel.cache.DiTCachePlan` for the expert (embed: the action / time MLP; first block:
expert layer 0; cached: layers 1 .. N-1; head: final norm + action projection; TeaCache's signal: layer 0's
(ada)RMS-normed input), runs the prefix once, then the denoising loop uncached and with each cache setting from
the same noise, and records steps reused and the action error (max / mean absolute difference in the normalized
action space) at 4 and 10 steps. Tiny presets, random weights: a record of what the mechanism does on this
architecture, not a quality claim. Writes ``bench/results/<date>_cache_pi0_expert_cpu.json``.

    python tools/cache_pi0_experiment.py
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from embodied_accel import load_policy  # noqa: E402
from embodied_accel.bench.harness import git_state  # noqa: E402
from embodied_accel.cache import CacheConfig, CachedDiT, DiTCachePlan  # noqa: E402
from embodied_accel.cli import load_observation  # noqa: E402
from embodied_accel.nn.gemma import PendingGatedResidual  # noqa: E402

CONFIGS = (
    CacheConfig(method="fbcache", residual_diff_threshold=0.05),
    CacheConfig(method="fbcache", residual_diff_threshold=0.2),
    CacheConfig(method="teacache", rel_l1_thresh=0.1),
    CacheConfig(method="teacache", rel_l1_thresh=0.3),
    CacheConfig(method="taylorseer", order=1, interval=2),
    CacheConfig(method="taylorseer", order=0, interval=2),
)


def expert_plan(model, context, batch: int) -> DiTCachePlan:
    cfg, ops = model.config, model.ops
    horizon, expert = cfg.action_horizon, model.expert

    def tensor(hidden):
        return hidden.resolve() if isinstance(hidden, PendingGatedResidual) else hidden

    def embed(x_t, step_constants):
        hidden = model.action_in_proj(x_t.view(batch * horizon, -1))
        if cfg.has_state_token:
            de = cfg.expert.width
            hidden = F.silu(ops.linear(hidden, model.action_time_mlp_in.weight_t[:de], step_constants))
            hidden = model.action_time_mlp_out(hidden)
        return hidden.to(model.compute_dtype)

    def conds(step_constants):
        return (None, None) if cfg.has_state_token else step_constants

    def layer(i, hidden, step_constants):
        layer_conds = conds(step_constants)[0]
        cond = None if layer_conds is None else layer_conds[i]
        return expert.layers[i](hidden, batch, horizon, context.rope_tables, context.attention_mask,
                                context.slots[i], cond)  # fmt: skip

    def rest(hidden, step_constants):
        for i in range(1, len(expert.layers)):
            hidden = layer(i, hidden, step_constants)
        return tensor(hidden)

    def head(out, step_constants):
        hidden = expert.final_norm(out, conds(step_constants)[1]).to(model.action_out_proj.weight_t.dtype)
        return model.action_out_proj(hidden).view(batch, horizon, -1)

    def modulated(hidden, step_constants):
        layer_conds = conds(step_constants)[0]
        first = expert.layers[0]
        if layer_conds is None:
            return ops.rms_norm(hidden, first.input_norm_weight, cfg.expert.eps)
        return ops.ada_rms_norm(hidden, layer_conds[0].input_scale_plus_one, layer_conds[0].input_shift, cfg.expert.eps)

    return DiTCachePlan(
        name=f"{cfg.name}-expert",
        embed=embed,
        first_block=lambda h, c: tensor(layer(0, h, c)),
        rest=rest,
        stream=lambda h: h,
        head=head,
        modulated_input=modulated,
    )


@torch.no_grad()
def run(preset: str, steps: int) -> list[dict]:
    policy = load_policy(preset, backend="reference")
    observation = load_observation(REPO_ROOT / "embodied_accel" / "data" / "sample_observation.npz")
    observation.pop("observation.language.tokens", None)  # the task text, tokenized by the tiny tokenizer
    inputs = policy.prepare(observation)
    model = policy.model
    batch = inputs.images.shape[0]
    buffers = policy.model_call.bound_buffers(
        policy.bucket(batch, inputs.images.shape[1], inputs.tokens.shape[1], steps)
    )
    image_tokens = model.embed_images(inputs.images)
    context = model.prefill(buffers, image_tokens, inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state)
    noise = policy.make_noise(batch, seed=0)
    reference = model.denoise(buffers, context, noise)
    plan = expert_plan(model, context, batch)
    dt = -1.0 / steps
    rows = []
    for config in CONFIGS:
        cached = CachedDiT(plan, config)
        session = cached.begin(steps)
        x_t = noise.to(torch.float32)
        for i, step_constants in enumerate(buffers.schedule.per_step):
            x_t = x_t.add(cached(x_t, step_constants, i), alpha=dt)
        error = (x_t - reference).abs()
        rows.append({"preset": preset, "steps": steps, "cache": config.describe(), **session.report.summary(),
                     "action_max_abs_error": float(error.max()), "action_mean_abs_error": float(error.mean()),
                     "action_scale": float(reference.abs().mean())})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    torch.set_num_threads(2)
    rows = [row for preset in ("pi0-tiny", "pi05-tiny") for steps in (4, 10) for row in run(preset, steps)]
    record = {
        "experiment": "dit cache on the pi0 / pi0.5 action expert (random-weight tiny presets)",
        "device": platform.processor() or platform.machine(), "backend": "reference", "dtype": "float32",
        "rows": rows, "versions": {"torch": torch.__version__},
        "git_sha": git_state()[0],
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }  # fmt: skip
    out = REPO_ROOT / "bench" / "results" / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}_cache_pi0_expert_cpu.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
