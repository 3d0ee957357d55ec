"""Static buffers have one owner (runtime/buffers.py) and an explicit lifetime; the policy's calls reuse them.

Regression tests for what a GPU or a real robot would hit first: a cache allocated on every call when the device
string has an index, a recompile per bucket, a batch whose rows differ on a missing leading camera, parameters that
hold autograd state.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from tolerances import pi0_tolerance

from embodied_accel import load_policy
from embodied_accel.models.vggt.loading import load_vggt_model
from embodied_accel.nn.kv_cache import StaticKVCache
from embodied_accel.platform import Platform, normalize_device, resolve_dtype
from embodied_accel.runtime.buffers import BufferSpec, StaticBuffers
from embodied_accel.runtime.runner import BucketedCall

torch.set_num_threads(1)


def observation(seed: int, *, base: bool = True, tokens: int = 12) -> dict:
    rng = np.random.default_rng(seed)
    obs = {
        "observation.images.left_wrist_0_rgb": rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=8).astype(np.float32),
        "observation.language.tokens": rng.integers(1, 1000, size=tokens),
    }
    if base:
        obs["observation.images.base_0_rgb"] = rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8)
    return obs


# ---------------------------------------------------------------------------------------------------- the owner


def test_buffers_are_reused_grown_and_retired():
    built = []

    def spec(batch, length, key=()):
        return {"cache": BufferSpec(lambda cap: built.append(cap) or torch.zeros(cap), (batch, length), key)}

    owner = StaticBuffers()
    first = owner.acquire(spec(2, 10))
    assert built == [(2, 10)] and owner.acquire(spec(1, 7)).serials == first.serials  # a smaller need fits
    assert owner.is_live(first.serials)
    grown = owner.acquire(spec(1, 12))  # longer: rebuilt for the elementwise maximum, the old one retired
    assert built[-1] == (2, 12) and grown.serials != first.serials
    assert not owner.is_live(first.serials) and owner.is_live(grown.serials)
    assert owner.builds["cache"] == 2 and owner.retired["cache"] == 1
    keyed = owner.acquire(spec(1, 1, key=5))  # another key: a distinct buffer, nothing retired
    assert owner.is_live(grown.serials) and owner.is_live(keyed.serials) and owner.retired["cache"] == 1
    assert owner.nbytes() == (2 * 12 + 1) * 4


def test_a_retired_buffer_is_freed_once_no_capture_reads_it():
    owner = StaticBuffers()
    call = BucketedCall(
        lambda buffers, x: buffers["cache"][: x.shape[0]] + x,
        plan=lambda batch: {"cache": BufferSpec(lambda cap: torch.zeros(cap), (batch,))},
        assemble=dict,
        mode="eager",
        buffers=owner,
    )
    call(2, torch.ones(2))
    old = weakref.ref(owner.acquire({"cache": BufferSpec(lambda cap: torch.zeros(cap), (1,))}).values["cache"])
    call(4, torch.ones(4))  # outgrows the cache: the old binding is dropped with it
    call(1, torch.ones(1))
    gc.collect()
    assert old() is None, "the outgrown buffer is still referenced"
    assert owner.builds["cache"] == 2


# ---------------------------------------------------------------------------------------------------- devices


def test_devices_are_normalized_once():
    assert normalize_device("cpu:0") == torch.device("cpu") == normalize_device("cpu")
    assert Platform("cuda", "gpu", True, False, device_index=1).device == torch.device("cuda:1")
    assert Platform("cpu", "cpu", False, False).device == torch.device("cpu")
    with pytest.raises(ValueError, match="device"):
        normalize_device("gpu0")


def test_one_dtype_table_with_per_model_choices():
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match=r"dtype: expected one of float32, fp32, bfloat16, bf16, got 'float16'"):
        resolve_dtype("float16", (torch.float32, torch.bfloat16))
    with pytest.raises(ValueError, match="dtype: expected one of .*, got torch.float64"):
        resolve_dtype(torch.float64)
    with pytest.raises(ValueError, match="got 'half'"):
        load_vggt_model("vggt-tiny", dtype="half", device="cpu", progress=False)


def test_a_device_with_an_index_allocates_one_cache_for_100_calls(monkeypatch):
    """``cpu:0`` stands for ``cuda`` vs ``cuda:0``: the buffers' device must not differ from the policy's."""
    allocations = []
    real_init = StaticKVCache.__init__
    monkeypatch.setattr(
        StaticKVCache, "__init__", lambda self, *a, **kw: allocations.append(a) or real_init(self, *a, **kw)
    )
    policy = load_policy("pi0-tiny", device="cpu:0", progress=False)
    obs = observation(0)
    first = policy.infer(obs, seed=0)["actions"]
    for _ in range(99):
        last = policy.infer(obs, seed=0)["actions"]
    np.testing.assert_array_equal(first, last)
    assert len(allocations) == 1, f"{len(allocations)} KV caches allocated in 100 calls"


@pytest.mark.compile
def test_compile_does_not_recompile_across_calls_and_buckets():
    policy = load_policy("pi0-tiny", device="cpu:0", capture="compile", progress=False)
    short, long = observation(1, tokens=12), observation(2, tokens=20)  # prompt buckets 16 and 32
    expected = {name: policy.infer(obs, seed=0)["actions"] for name, obs in (("short", short), ("long", long))}
    with torch.compiler.set_stance("fail_on_recompile"):
        for name, obs in (("short", short), ("long", long), ("short", short)):
            np.testing.assert_array_equal(policy.infer(obs, seed=0)["actions"], expected[name])


# ---------------------------------------------------------------------------------------------------- batches


@pytest.mark.parametrize("preset", ["pi0-tiny", "pi05-tiny"])
def test_rows_that_differ_on_a_missing_leading_camera_batch_together(preset):
    policy = load_policy(preset, progress=False)
    without_base, with_base = observation(3, base=False), observation(4)
    batched = policy.infer_batch([without_base, with_base], seed=0)["actions"]
    noise = policy.make_noise(2, seed=0)
    for row, obs in enumerate((without_base, with_base)):
        single = policy.infer(obs, noise=noise[row].cpu())["actions"]
        # a batch of 2 blocks its GEMMs otherwise than a batch of 1: the same sums in another order
        atol = pi0_tolerance(policy.config) * np.abs(single).max()
        np.testing.assert_allclose(batched[row], single, rtol=0, atol=atol)


# ---------------------------------------------------------------------------------------------------- autograd


def test_inference_parameters_hold_no_autograd_state():
    policy = load_policy("pi05-tiny", progress=False)
    assert not any(p.requires_grad for p in policy.model.parameters())
    model, inputs = policy.model, policy.prepare(observation(5))
    buffers = policy.model_call.bound_buffers(policy.bucket(1, inputs.images.shape[1], inputs.tokens.shape[1], None))
    args = (model.embed_images(inputs.images), inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state)
    context = model.prefill(buffers, *args)
    x_t = policy.make_noise(1, seed=0)
    velocity = model.denoise_step(  # public, outside any no_grad block
        x_t, buffers.schedule.per_step[0], context.rope_tables, context.attention_mask, context.slots
    )
    assert velocity.shape == x_t.shape and not velocity.requires_grad


# ---------------------------------------------------------------------------------------------------- memory figures


def test_peak_memory_is_the_devices_own_figure_on_an_npu(monkeypatch):
    """On an NPU the peak is the device allocator's, not the host process's resident set."""

    class FakeNpu:
        resets = 0

        @classmethod
        def reset_peak_memory_stats(cls, device=None):
            assert device == 0  # the platform's own device, by index
            cls.resets += 1

        @staticmethod
        def max_memory_allocated(device=None):
            assert device == 0
            return 3 * 2**30

    monkeypatch.setattr(torch, "npu", FakeNpu, raising=False)
    npu = Platform("npu", "stand-in NPU", has_triton=False, has_torch_npu=True)
    npu.reset_peak_memory()
    assert FakeNpu.resets == 1
    assert npu.peak_memory_mb() == 3 * 1024 and npu.peak_memory_kind == "device_allocated"
    assert Platform("cpu", "cpu", False, False).peak_memory_kind == "host_rss"
