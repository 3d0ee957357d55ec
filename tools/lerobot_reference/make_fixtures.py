#!/usr/bin/env python
"""Generate the LeRobot 0.6.1 reference fixtures ``tests/fixtures/pi0_tiny`` and ``tests/fixtures/pi05_tiny``.

This script is NOT run by CI.  It must be run with a Python environment that has
``lerobot[pi]==0.6.1`` installed (see ``tools/lerobot_reference/README.md``)::

    /path/to/venv/bin/python tools/lerobot_reference/make_fixtures.py

It imports and drives LeRobot's own ``PI0Policy`` / ``PI05Policy`` (no LeRobot code is copied
here).  To keep the fixtures small, the policies are built at a reduced ("tiny") size by
patching, *in this process only*, the names that ``modeling_pi0`` / ``modeling_pi05`` use to
build the backbones:

* ``get_gemma_config``: ``"gemma_2b"`` (the VLM variant in the config) -> tiny VLM,
  ``"gemma_300m"`` (the action-expert variant) -> tiny expert.
* ``PaliGemmaForConditionalGenerationWithPiGemma`` / ``PiGemmaForCausalLM``: thin factories that
  shrink the (hard-coded) vocabulary 257152 -> 1024 and the SigLIP tower, then call LeRobot's
  real classes.  The module tree, and therefore every state-dict key, is exactly LeRobot's.

Every parameter is then overwritten with seeded random values (norm weights / biases and the
adaRMS ``dense`` layers included, which LeRobot initialises to zero) so that every weight
matters for the reference outputs.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)

import lerobot  # noqa: E402
import transformers  # noqa: E402
from lerobot.configs import FeatureType, PolicyFeature  # noqa: E402
from lerobot.policies import pi_gemma  # noqa: E402
from lerobot.policies.pi0 import modeling_pi0  # noqa: E402
from lerobot.policies.pi05 import modeling_pi05  # noqa: E402
from lerobot.processor import tokenizer_processor  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures"

# --------------------------------------------------------------------------------------
# Reduced configuration (must match the `pi0-tiny` / `pi05-tiny` presets of embodied_accel)
# --------------------------------------------------------------------------------------
VOCAB_SIZE = 1024
VISION = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    patch_size=14,
    image_size=224,
    layer_norm_eps=1e-6,
    hidden_act="gelu_pytorch_tanh",
    projection_dim=64,  # = VLM width
)
VLM = dict(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
EXPERT = dict(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=16)

CAMERAS = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
PRESENT_CAMERAS = ["base_0_rgb", "left_wrist_0_rgb"]  # right_wrist_0_rgb is missing from the batch
STATE_DIM = 8
ACTION_DIM = 7
BATCH = 2
RAW_HW = (180, 240)  # deliberately not 224x224 so that resize-with-pad is exercised
VALID_TOKENS = (20, 33)
TASKS = ["pick up the red block", "open_the drawer\n"]
TOKENIZER_NAME = "google/paligemma-3b-pt-224"  # what LeRobot's processors reference

POLICIES = {
    "pi0": dict(dir="pi0_tiny", tokenizer_max_length=48, model_seed=1000, data_seed=2000),
    "pi05": dict(dir="pi05_tiny", tokenizer_max_length=200, model_seed=1005, data_seed=2005),
}

WARMUP_CALLS = 3
TIMED_CALLS = 20


# --------------------------------------------------------------------------------------
# Patches (this process only)
# --------------------------------------------------------------------------------------
def _tiny_get_gemma_config(variant: str):
    if variant == "gemma_2b":
        return modeling_pi0.GemmaConfig(**VLM)
    if variant == "gemma_300m":
        return modeling_pi0.GemmaConfig(**EXPERT)
    raise ValueError(f"Unknown variant: {variant}")


def _tiny_paligemma(config):
    """Shrink vocab + SigLIP in LeRobot's PaliGemma config, then build LeRobot's real class."""
    config.vocab_size = VOCAB_SIZE
    config._vocab_size = VOCAB_SIZE  # noqa: SLF001  (LeRobot sets this legacy attribute too)
    config.image_token_index = VOCAB_SIZE
    config.text_config.vocab_size = VOCAB_SIZE
    config.projection_dim = VISION["projection_dim"]
    config.hidden_size = config.text_config.hidden_size
    for key, value in VISION.items():
        setattr(config.vision_config, key, value)
    config.text_config.num_image_tokens = (VISION["image_size"] // VISION["patch_size"]) ** 2
    return pi_gemma.PaliGemmaForConditionalGenerationWithPiGemma(config)


def _tiny_expert(config, **kwargs):
    config.vocab_size = VOCAB_SIZE
    return pi_gemma.PiGemmaForCausalLM(config, **kwargs)


class _OfflineAutoTokenizer:
    """Stand-in for transformers.AutoTokenizer inside LeRobot's TokenizerProcessorStep.

    No hub access is available, so `TokenizerProcessorStep(tokenizer_name=...)` gets this dummy
    object.  `tokenizer_name` is still what is serialised, i.e. the saved json is exactly what
    LeRobot writes with the real tokenizer.  The fixture tokens are random ids (see io.json).
    """

    @staticmethod
    def from_pretrained(name, *args, **kwargs):
        return _DummyTokenizer(name)


class _DummyTokenizer:
    def __init__(self, name):
        self.name_or_path = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError("offline dummy tokenizer: fixtures use random token ids")


def install_patches() -> None:
    for mod in (modeling_pi0, modeling_pi05):
        mod.get_gemma_config = _tiny_get_gemma_config
        mod.PaliGemmaForConditionalGenerationWithPiGemma = _tiny_paligemma
        mod.PiGemmaForCausalLM = _tiny_expert
    tokenizer_processor.AutoTokenizer = _OfflineAutoTokenizer


# --------------------------------------------------------------------------------------
# Construction + randomisation
# --------------------------------------------------------------------------------------
def make_config(kind: str):
    spec = POLICIES[kind]
    if kind == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Cfg
    else:
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Cfg
    input_features = {
        f"observation.images.{cam}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224))
        for cam in CAMERAS
    }
    input_features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    return Cfg(
        input_features=input_features,
        output_features=output_features,
        device="cpu",
        dtype="float32",
        chunk_size=50,
        n_action_steps=50,
        max_state_dim=32,
        max_action_dim=32,
        num_inference_steps=10,
        tokenizer_max_length=spec["tokenizer_max_length"],
    )


def build_policy(kind: str, seed: int):
    torch.manual_seed(seed)
    cfg = make_config(kind)
    if kind == "pi0":
        policy = modeling_pi0.PI0Policy(cfg)
    else:
        policy = modeling_pi05.PI05Policy(cfg)
    policy.eval()
    return policy


def _normal(gen, shape, std, mean=0.0):
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> dict[str, int]:
    """Overwrite EVERY parameter with seeded random values (std chosen to keep activations O(1))."""
    gen = torch.Generator().manual_seed(seed)
    done: set[int] = set()
    counts: collections.Counter = collections.Counter()

    def put(p, value, tag):
        if p is None or id(p) in done:
            return
        assert p.shape == value.shape, (p.shape, value.shape)
        p.copy_(value.to(p.dtype))
        done.add(id(p))
        counts[tag] += 1

    for name, mod in model.named_modules():
        if isinstance(mod, pi_gemma.PiGemmaRMSNorm):
            if getattr(mod, "weight", None) is not None:  # plain RMSNorm: out = x_hat * (1 + w)
                put(mod.weight, _normal(gen, mod.weight.shape, 0.1), "rmsnorm.weight")
            if mod.dense is not None:  # adaRMS modulation (zero-initialised in LeRobot)
                put(mod.dense.weight, _normal(gen, mod.dense.weight.shape, 0.1), "adarms.dense.weight")
                put(mod.dense.bias, _normal(gen, mod.dense.bias.shape, 0.1), "adarms.dense.bias")
        elif isinstance(mod, nn.LayerNorm):
            put(mod.weight, _normal(gen, mod.weight.shape, 0.1, mean=1.0), "layernorm.weight")
            put(mod.bias, _normal(gen, mod.bias.shape, 0.1), "layernorm.bias")
        elif isinstance(mod, nn.Linear):
            fan_in = mod.weight.shape[1]
            put(mod.weight, _normal(gen, mod.weight.shape, 1.0 / math.sqrt(fan_in)), "linear.weight")
            if mod.bias is not None:
                put(mod.bias, _normal(gen, mod.bias.shape, 0.05), "linear.bias")
        elif isinstance(mod, nn.Conv2d):
            fan_in = mod.weight[0].numel()
            put(mod.weight, _normal(gen, mod.weight.shape, 1.0 / math.sqrt(fan_in)), "conv.weight")
            if mod.bias is not None:
                put(mod.bias, _normal(gen, mod.bias.shape, 0.05), "conv.bias")
        elif isinstance(mod, nn.Embedding):
            if name.endswith("embed_tokens"):
                # GemmaTextScaledWordEmbedding multiplies by sqrt(width): N(0, 1/width) -> O(1)
                std = 1.0 / math.sqrt(mod.weight.shape[1])
                put(mod.weight, _normal(gen, mod.weight.shape, std), "token_embedding")
            else:  # SigLIP position embedding
                put(mod.weight, _normal(gen, mod.weight.shape, 0.2), "position_embedding")

    missing = [n for n, p in model.named_parameters(remove_duplicate=False) if id(p) not in done]
    if missing:
        raise RuntimeError(f"parameters not randomised: {missing}")
    return dict(counts)


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------
def make_stats(gen: torch.Generator, dim: int) -> dict[str, np.ndarray]:
    def u(lo, hi):
        return torch.rand(dim, generator=gen) * (hi - lo) + lo

    mean = torch.randn(dim, generator=gen) * 0.5
    std = u(0.2, 1.0)  # > 0.1
    q01 = mean - 2.3 * std * u(0.8, 1.2)
    q99 = mean + 2.3 * std * u(0.8, 1.2)  # q01 < q99
    mn = q01 - std * u(0.05, 0.5)
    mx = q99 + std * u(0.05, 0.5)
    return {
        k: v.to(torch.float32).numpy()
        for k, v in dict(mean=mean, std=std, min=mn, max=mx, q01=q01, q99=q99).items()
    }


def make_data(kind: str, seed: int, tokenizer_max_length: int, max_action_dim: int, chunk: int):
    gen = torch.Generator().manual_seed(seed)
    stats = {"observation.state": make_stats(gen, STATE_DIM), "action": make_stats(gen, ACTION_DIM)}
    images_raw = {
        cam: torch.rand((BATCH, 3, *RAW_HW), generator=gen, dtype=torch.float32) for cam in PRESENT_CAMERAS
    }
    s = stats["observation.state"]
    q01, q99 = torch.from_numpy(s["q01"]), torch.from_numpy(s["q99"])
    state_raw = q01 + torch.rand((BATCH, STATE_DIM), generator=gen) * (q99 - q01)
    tokens = torch.randint(1, VOCAB_SIZE, (BATCH, tokenizer_max_length), generator=gen, dtype=torch.int64)
    token_masks = torch.zeros((BATCH, tokenizer_max_length), dtype=torch.bool)
    for i, n in enumerate(VALID_TOKENS):
        token_masks[i, :n] = True
    tokens = torch.where(token_masks, tokens, torch.zeros_like(tokens))
    noise = torch.randn((BATCH, chunk, max_action_dim), generator=gen, dtype=torch.float32)
    return stats, images_raw, state_raw.to(torch.float32), tokens, token_masks, noise


# --------------------------------------------------------------------------------------
# Op counting / timing
# --------------------------------------------------------------------------------------
class _CountingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = 0
        self.in_loop = 0
        self.in_denoise = 0
        self.loop_depth = 0
        self.denoise_depth = 0
        self.denoise_calls = 0
        self.hist: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        self.hist[str(func.overloadpacket)] += 1
        if self.loop_depth:
            self.in_loop += 1
        if self.denoise_depth:
            self.in_denoise += 1
        return func(*args, **(kwargs or {}))


def count_ops(policy, mod, call) -> dict:
    mode = _CountingMode()
    inner = policy.model
    orig_denoise = inner.denoise_step
    orig_euler = mod.euler_integrate

    def denoise_wrapped(*a, **k):
        mode.denoise_calls += 1
        mode.denoise_depth += 1
        try:
            return orig_denoise(*a, **k)
        finally:
            mode.denoise_depth -= 1

    def euler_wrapped(*a, **k):
        mode.loop_depth += 1
        try:
            return orig_euler(*a, **k)
        finally:
            mode.loop_depth -= 1

    inner.denoise_step = denoise_wrapped
    mod.euler_integrate = euler_wrapped
    try:
        with mode:
            out = call()
    finally:
        del inner.denoise_step
        mod.euler_integrate = orig_euler
    return dict(
        out=out,
        aten_ops_per_call=mode.total,
        aten_ops_in_denoising_loop=mode.in_loop,
        aten_ops_in_denoise_step_calls=mode.in_denoise,
        denoise_step_calls=mode.denoise_calls,
        aten_ops_per_denoise_step=mode.in_denoise / max(mode.denoise_calls, 1),
        aten_ops_outside_denoising_loop=mode.total - mode.in_loop,
        aten_op_histogram=dict(sorted(mode.hist.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def time_calls(call) -> dict:
    for _ in range(WARMUP_CALLS):
        call()
    times = []
    for _ in range(TIMED_CALLS):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return dict(
        warmup_calls=WARMUP_CALLS,
        timed_calls=TIMED_CALLS,
        mean_s=float(np.mean(times)),
        min_s=float(np.min(times)),
        max_s=float(np.max(times)),
        torch_num_threads=torch.get_num_threads(),
        machine=platform.machine(),
        processor=platform.processor() or None,
    )


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------
def _find_step(pipeline, cls):
    steps = [s for s in pipeline.steps if isinstance(s, cls)]
    assert len(steps) == 1, (cls, pipeline.steps)
    return steps[0]


def make_fixture(kind: str, out_root: Path, do_timing: bool) -> None:
    from lerobot.lerobot_types import TransitionKey
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.processor import (
        NormalizerProcessorStep,
        PolicyProcessorPipeline,
        UnnormalizerProcessorStep,
        create_transition,
    )
    from lerobot.processor.converters import (
        batch_to_transition,
        policy_action_to_transition,
        transition_to_batch,
        transition_to_policy_action,
    )

    spec = POLICIES[kind]
    mod = modeling_pi0 if kind == "pi0" else modeling_pi05
    out = out_root / spec["dir"]
    out.mkdir(parents=True, exist_ok=True)
    print(f"=== {kind} -> {out}")

    policy = build_policy(kind, spec["model_seed"])
    init_counts = randomize_(policy, spec["model_seed"] + 1)
    sd = policy.state_dict()
    n_params = sum(p.numel() for p in policy.parameters())
    print(f"randomised tensors: {sum(init_counts.values())} {init_counts}")
    print(f"state_dict tensors: {len(sd)}, parameters: {n_params}")

    pali = policy.model.paligemma_with_expert.paligemma
    lm_head_tied = pali.lm_head.weight.data_ptr() == pali.model.language_model.embed_tokens.weight.data_ptr()
    print(f"paligemma lm_head shares storage with embed_tokens: {lm_head_tied}")
    emb = pali.model.language_model.embed_tokens
    print(f"embed_tokens: {type(emb).__name__} {tuple(emb.weight.shape)} embed_scale={float(emb.embed_scale)}")

    cfg = policy.config
    stats, images_raw, state_raw, tokens, token_masks, noise = make_data(
        kind, spec["data_seed"], cfg.tokenizer_max_length, cfg.max_action_dim, cfg.chunk_size
    )

    # ---- policy + processors on disk, in LeRobot's layout
    policy.save_pretrained(out)
    preprocessor, postprocessor = make_pre_post_processors(cfg, dataset_stats=stats)
    preprocessor.save_pretrained(out)
    postprocessor.save_pretrained(out)

    # ---- normalised state via the (reloaded) preprocessor's normalizer step
    pre_loaded = PolicyProcessorPipeline.from_pretrained(
        out,
        config_filename="policy_preprocessor.json",
        to_transition=batch_to_transition,
        to_output=transition_to_batch,
    )
    post_loaded = PolicyProcessorPipeline.from_pretrained(
        out,
        config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    normalizer = _find_step(pre_loaded, NormalizerProcessorStep)
    _find_step(post_loaded, UnnormalizerProcessorStep)
    tr = create_transition(
        observation={"observation.state": state_raw.clone()},
        complementary_data={"task": list(TASKS)},
    )
    tr = normalizer(tr)
    state_normalized = tr[TransitionKey.OBSERVATION]["observation.state"].to(torch.float32)
    mem_norm = _find_step(preprocessor, NormalizerProcessorStep)(
        create_transition(observation={"observation.state": state_raw.clone()})
    )[TransitionKey.OBSERVATION]["observation.state"]
    assert torch.equal(mem_norm, state_normalized)

    prompts = None
    if kind == "pi05":
        from lerobot.policies.pi05.processor_pi05 import Pi05PrepareStateTokenizerProcessorStep

        step = _find_step(pre_loaded, Pi05PrepareStateTokenizerProcessorStep)
        prompts = step(tr)[TransitionKey.COMPLEMENTARY_DATA]["task"]
        print("prompts:", prompts)

    # ---- model inputs exactly as the policy prepares them
    batch = {f"observation.images.{c}": images_raw[c].clone() for c in PRESENT_CAMERAS}
    batch["observation.state"] = state_normalized.clone()
    batch["observation.language.tokens"] = tokens
    batch["observation.language.attention_mask"] = token_masks
    images_list, img_masks_list = policy._preprocess_images(batch)  # noqa: SLF001
    images = torch.stack(images_list, dim=1).contiguous()
    image_masks = torch.stack(img_masks_list, dim=1).contiguous()
    if kind == "pi0":
        state = policy.prepare_state(batch)
        model_args = (images_list, img_masks_list, tokens, token_masks, state)
    else:
        state = None
        model_args = (images_list, img_masks_list, tokens, token_masks)

    def call():
        return policy.model.sample_actions(*model_args, noise=noise.clone())

    with torch.no_grad():
        actions_model = call()
        # cross-check: the whole policy path (predict_action_chunk) with the same noise
        chunk = policy.predict_action_chunk(batch, noise=noise.clone())
        assert torch.equal(chunk, actions_model[:, :, :ACTION_DIM]), "predict_action_chunk mismatch"
        actions = post_loaded(actions_model[:, :, :ACTION_DIM].clone())
        actions_mem = postprocessor(actions_model[:, :, :ACTION_DIM].clone())
        assert torch.equal(actions, actions_mem)
    assert torch.isfinite(actions_model).all()
    print(f"actions_model: std={actions_model.std():.4f} absmax={actions_model.abs().max():.4f}")

    tensors = {f"image_raw.{c}": images_raw[c] for c in PRESENT_CAMERAS}
    tensors.update(
        state_raw=state_raw,
        state_normalized=state_normalized,
        images=images,
        image_masks=image_masks,
        tokens=tokens,
        token_masks=token_masks,
        noise=noise,
        actions_model=actions_model,
        actions=actions,
    )
    if state is not None:
        tensors["state"] = state
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    save_file(tensors, out / "io.safetensors")

    # ---- op counts + timing
    with torch.no_grad():
        counts = count_ops(policy, mod, call)
        assert torch.equal(counts.pop("out"), actions_model)
        timing = time_calls(call) if do_timing else None

    pwe = policy.model.paligemma_with_expert
    info = dict(
        policy=kind,
        lerobot_class=type(policy).__name__,
        versions=dict(
            lerobot=lerobot.__version__,
            torch=torch.__version__,
            transformers=transformers.__version__,
            python=sys.version.split()[0],
            numpy=np.__version__,
        ),
        seeds=dict(
            model_construction=spec["model_seed"],
            model_randomization=spec["model_seed"] + 1,
            data=spec["data_seed"],
        ),
        tiny_config=dict(
            vocab_size=VOCAB_SIZE,
            vision=VISION,
            vlm=VLM,
            action_expert=EXPERT,
            variant_mapping={"paligemma_variant=gemma_2b": "vlm", "action_expert_variant=gemma_300m": "action_expert"},
            chunk_size=cfg.chunk_size,
            n_action_steps=cfg.n_action_steps,
            max_state_dim=cfg.max_state_dim,
            max_action_dim=cfg.max_action_dim,
            num_inference_steps=cfg.num_inference_steps,
            tokenizer_max_length=cfg.tokenizer_max_length,
            dtype=cfg.dtype,
            image_resolution=list(cfg.image_resolution),
            normalization_mapping={k: v.value for k, v in cfg.normalization_mapping.items()},
        ),
        randomization=dict(
            rule=(
                "Linear/Conv weight N(0, 1/fan_in), bias N(0, 0.05); token embedding N(0, 1/width) "
                "(scaled by sqrt(width) in forward); SigLIP position embedding N(0, 0.2); "
                "LayerNorm weight N(1, 0.1), bias N(0, 0.1); PiGemmaRMSNorm weight N(0, 0.1); "
                "adaRMS dense weight/bias N(0, 0.1)"
            ),
            tensors_per_kind=init_counts,
            state_dict_tensors=len(sd),
            parameters=n_params,
        ),
        data=dict(
            batch_size=BATCH,
            cameras=[f"observation.images.{c}" for c in CAMERAS],
            present_cameras=[f"observation.images.{c}" for c in PRESENT_CAMERAS],
            missing_cameras=[f"observation.images.{c}" for c in CAMERAS if c not in PRESENT_CAMERAS],
            image_raw_shape=[BATCH, 3, *RAW_HW],
            image_raw_range=[0.0, 1.0],
            valid_tokens_per_row=list(VALID_TOKENS),
            tokens_note="random ids in [1, vocab); padding id 0 with mask False (not from a tokenizer)",
            tasks=list(TASKS),
            dataset_stats={k: {s: v.tolist() for s, v in d.items()} for k, d in stats.items()},
        ),
        paligemma_lm_head_tied_to_embed_tokens=bool(lm_head_tied),
        backbone_details=dict(
            attn_implementation_after_call={
                "vision_tower": pwe.paligemma.model.vision_tower.config._attn_implementation,  # noqa: SLF001
                "vlm": pwe.paligemma.model.language_model.config._attn_implementation,  # noqa: SLF001
                "action_expert": pwe.gemma_expert.model.config._attn_implementation,  # noqa: SLF001
            },
            vlm_rms_norm_eps=pwe.paligemma.model.language_model.config.rms_norm_eps,
            expert_rms_norm_eps=pwe.gemma_expert.model.config.rms_norm_eps,
            vlm_rope_parameters=getattr(pwe.paligemma.model.language_model.config, "rope_parameters", None),
            expert_rope_parameters=getattr(pwe.gemma_expert.model.config, "rope_parameters", None),
            embed_scale=float(emb.embed_scale),
        ),
        tensors={k: dict(dtype=str(v.dtype).replace("torch.", ""), shape=list(v.shape)) for k, v in tensors.items()},
        sample_actions_call=(
            "policy.model.sample_actions(images_list, img_masks_list, tokens, token_masks, state, noise=noise)"
            if kind == "pi0"
            else "policy.model.sample_actions(images_list, img_masks_list, tokens, token_masks, noise=noise)"
        ),
        **counts,
        sample_actions_wall_time=timing,
    )
    if prompts is not None:
        info["prompts"] = list(prompts)
        info["prompts_note"] = (
            "built by LeRobot's Pi05PrepareStateTokenizerProcessorStep from state_normalized and tasks; "
            "the stored `tokens` are random ids, NOT the tokenization of these prompts"
        )
    with open(out / "io.json", "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    print(
        f"ops/call={counts['aten_ops_per_call']} in_loop={counts['aten_ops_in_denoising_loop']} "
        f"in_denoise_step={counts['aten_ops_in_denoise_step_calls']} "
        f"({counts['denoise_step_calls']} calls) time={timing and round(timing['mean_s'], 4)}s"
    )

    verify(kind, out)


@torch.no_grad()
def verify(kind: str, out: Path) -> None:
    """Rebuild the tiny policy, load model.safetensors strictly, rerun, compare exactly."""
    spec = POLICIES[kind]
    policy = build_policy(kind, 0)  # different seed on purpose: everything must come from the file
    sd = load_file(out / "model.safetensors")
    missing, unexpected = policy.load_state_dict(sd, strict=True)
    assert not missing and not unexpected
    io = load_file(out / "io.safetensors")
    images_list = list(io["images"].unbind(1))
    masks_list = list(io["image_masks"].unbind(1))
    args = [images_list, masks_list, io["tokens"], io["token_masks"]]
    if kind == "pi0":
        args.append(io["state"])
    got = policy.model.sample_actions(*args, noise=io["noise"].clone())
    assert torch.equal(got, io["actions_model"]), (got - io["actions_model"]).abs().max()
    # the policy's own image preprocessing reproduces `images` from `image_raw.*`
    batch = {f"observation.images.{c}": io[f"image_raw.{c}"] for c in PRESENT_CAMERAS}
    imgs, msks = policy._preprocess_images(batch)  # noqa: SLF001
    assert torch.equal(torch.stack(imgs, 1), io["images"]) and torch.equal(torch.stack(msks, 1), io["image_masks"])
    print(f"verify {spec['dir']}: reload strict OK, {len(sd)} tensors, sample_actions reproduced exactly")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="fixtures root (default: tests/fixtures)")
    ap.add_argument("--only", choices=sorted(POLICIES), action="append", help="build only this policy")
    ap.add_argument("--no-timing", action="store_true", help="skip the wall-time measurement")
    args = ap.parse_args()
    install_patches()
    for kind in args.only or ["pi0", "pi05"]:
        make_fixture(kind, args.out, do_timing=not args.no_timing)
    for kind in args.only or ["pi0", "pi05"]:
        d = args.out / POLICIES[kind]["dir"]
        total = 0
        for f in sorted(d.iterdir()):
            total += f.stat().st_size
            print(f"{f.relative_to(args.out)}: {f.stat().st_size} bytes")
        print(f"{d.name} total: {total} bytes")


if __name__ == "__main__":
    main()
