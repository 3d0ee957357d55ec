"""Whole-call CUDA graphs: bucket bookkeeping and static buffers (on the CPU through a replay stand-in),
and the real capture on an NVIDIA GPU when there is one."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerances import pi0_tolerance
from torch.utils._python_dispatch import TorchDispatchMode

from embodied_accel import load_policy
from embodied_accel.platform import Platform
from embodied_accel.runtime import CaptureUnavailableError, capture_call
from embodied_accel.runtime.cudagraph import GraphedCall, ReplayByCalling
from embodied_accel.runtime.runner import BucketedCall

FIXTURES = Path(__file__).parent / "fixtures"
GPU = Platform("cuda", "CPU stand-in for a GPU", has_triton=True, has_torch_npu=False)
requires_cuda = pytest.mark.gpu  # skipped with a reason without one (conftest.py)


#: aten ops that cannot be inside a CUDA graph: a host sync (reading a value), data-dependent output
#: shapes, or a host-to-device copy of Python data (torch.tensor(...) lifts a CPU tensor first).
CAPTURE_UNSAFE = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2", "lift_fresh"}


class CaptureSafety(TorchDispatchMode):
    """Records every capture-unsafe aten op the wrapped code dispatches."""

    def __init__(self):
        super().__init__()
        self.unsafe: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        boolean_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
        )
        if name in CAPTURE_UNSAFE or boolean_index:  # a boolean index has a data-dependent shape
            self.unsafe.append(str(func))
        return func(*args, **(kwargs or {}))


class ReplayStandIn(ReplayByCalling):
    """The runtime's CPU replay stand-in, which also checks the captured call for ops a real capture would reject."""

    def record(self, fn, static_args, static_kwargs):
        with CaptureSafety() as safety:
            static_output = fn(*static_args, **static_kwargs)
        assert not safety.unsafe, f"capture-unsafe ops in the captured call: {sorted(set(safety.unsafe))}"
        return static_output


def raw_batch(policy, seed, batch=2):
    rng = np.random.default_rng(seed)
    observations = [
        {
            "observation.images.base_0_rgb": rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8),
            "observation.images.left_wrist_0_rgb": rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8),
            "observation.state": rng.normal(size=8).astype(np.float32),
            "observation.language.tokens": rng.integers(1, 1000, size=int(rng.integers(17, 32))),
        }
        for _ in range(batch)
    ]
    return policy.prepare_raw(observations)


def graphed_whole_call(policy, standin) -> BucketedCall:
    """The policy's whole call in ``cudagraph`` mode on the CPU: the real executor (buffers, one graph per input
    shape, invalidation), with the replay stand-in in place of CUDA graphs."""
    return BucketedCall(
        policy._whole_call, policy.plan, policy.assemble, mode="cudagraph", buffers=policy.buffers, plat=GPU,
        graph_backend=standin,
    )  # fmt: skip


def run_graphed(policy, call, raw, noise):
    bucket = policy.bucket(raw.batch_size, len(raw.frames), raw.tokens.shape[1], None)
    return call(bucket, raw.frames, raw.image_masks, raw.tokens, raw.token_masks, raw.state, noise)


def test_one_capture_per_bucket_static_inputs_and_private_outputs():
    policy = load_policy("pi0-tiny", progress=False)
    policy.reserve(2)  # buffers for batch 2 first: the batch-1 bucket below reuses them
    standin = ReplayStandIn()
    graphed = graphed_whole_call(policy, standin)

    def call(raw, noise):
        return run_graphed(policy, graphed, raw, noise)

    raw_a, raw_b = raw_batch(policy, 0), raw_batch(policy, 1)
    assert raw_a.tokens.shape == raw_b.tokens.shape  # same bucket
    noise_a, noise_b = policy.make_noise(2, seed=0), policy.make_noise(2, seed=1)
    out_a = call(raw_a, noise_a)
    torch.testing.assert_close(out_a, policy.run(raw_a, noise_a), rtol=0, atol=0)
    out_b = call(raw_b, noise_b)  # replayed: inputs copied into the captured tensors
    (graphs,) = graphed.graphs  # one set of buffers: one graph wrapper
    assert standin.captures == 1 and len(graphs.buckets) == 1 and graphs.replays == 2
    torch.testing.assert_close(out_b, policy.run(raw_b, noise_b), rtol=0, atol=0)
    assert not torch.equal(out_a, out_b)
    out_a.zero_()  # the caller owns what it got back
    raw_b.state.add_(100.0)  # and may reuse its input tensors after the call
    torch.testing.assert_close(call(raw_a, noise_a), policy.run(raw_a, noise_a), rtol=0, atol=0)

    single = raw_batch(policy, 2, batch=1)  # another shape: another graph, on the same buffers
    torch.testing.assert_close(call(single, noise_a[:1]), policy.run(single, noise_a[:1]), rtol=0, atol=0)
    (graphs,) = graphed.graphs
    assert standin.captures == 2 and len(graphs.capture_seconds) == 2
    assert graphed.capture_seconds >= 0
    call(raw_a, noise_a)
    assert standin.captures == 2 and policy.buffers.builds["kv_cache"] == 1


def test_graphs_that_read_an_outgrown_buffer_are_dropped_and_recaptured():
    """A larger batch retires the KV cache: the graphs captured against it are dropped (their memory and the old
    cache freed), and the next call of their bucket captures again against the new cache."""
    policy = load_policy("pi0-tiny", progress=False)
    standin = ReplayStandIn()
    graphed = graphed_whole_call(policy, standin)
    small, large = raw_batch(policy, 0, batch=1), raw_batch(policy, 1, batch=3)
    noise_small, noise_large = policy.make_noise(1, seed=0), policy.make_noise(3, seed=1)
    first = run_graphed(policy, graphed, small, noise_small)
    small_bucket = policy.bucket(1, len(small.frames), small.tokens.shape[1], None)
    old_cache = weakref.ref(graphed.bound_buffers(small_bucket).kv_cache)
    run_graphed(policy, graphed, large, noise_large)  # outgrows the batch-1 cache
    assert policy.buffers.retired["kv_cache"] == 1 and len(graphed.graphs) == 1
    gc.collect()
    assert old_cache() is None, "the outgrown cache is still referenced (by a graph that was not dropped?)"
    again = run_graphed(policy, graphed, small, noise_small)  # recaptured against the batch-3 cache
    assert standin.captures == 3
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_capture_safety_check_catches_syncs_and_host_data():
    for bad in (lambda x: x.sum().item(), lambda x: x[x > 0], lambda x: x + torch.tensor(1.0)):
        with CaptureSafety() as safety:
            bad(torch.randn(4))
        assert safety.unsafe, bad


@pytest.mark.parametrize("preset", ["pi0-tiny", "pi05-tiny"])
def test_whole_call_is_capture_safe(preset):
    policy = load_policy(preset, progress=False)
    graphed = graphed_whole_call(policy, ReplayStandIn())  # asserts inside capture
    raw = raw_batch(policy, 3)
    noise = policy.make_noise(2, seed=0)
    out = run_graphed(policy, graphed, raw, noise)
    torch.testing.assert_close(out, policy.run(raw, noise), rtol=0, atol=0)


def test_bucket_key_separates_shapes_dtypes_and_plain_values():
    key = GraphedCall.bucket_key
    a = [torch.zeros(2, 3), 10]
    assert key(a, "spec") == key([torch.ones(2, 3), 10], "spec")
    assert key(a, "spec") != key([torch.zeros(2, 4), 10], "spec")
    assert key(a, "spec") != key([torch.zeros(2, 3, dtype=torch.float64), 10], "spec")
    assert key(a, "spec") != key([torch.zeros(2, 3), 5], "spec")


def test_cudagraph_modes_need_a_gpu():
    cpu = Platform("cpu", "test cpu", has_triton=True, has_torch_npu=False)
    for mode in ("cudagraph", "compile+cudagraph"):
        with pytest.raises(CaptureUnavailableError, match="needs an NVIDIA GPU"):
            capture_call(lambda: None, mode, cpu)


@requires_cuda
@pytest.mark.parametrize("preset", ["pi0-tiny", "pi05-tiny"])
@pytest.mark.parametrize("mode", ["cudagraph", pytest.param("compile+cudagraph", marks=pytest.mark.compile)])
def test_cuda_graph_call_equals_eager_on_the_gpu(preset, mode):
    eager = load_policy(preset, device="cuda", progress=False)
    graphed = load_policy(preset, device="cuda", capture=mode, progress=False)
    for seed in range(3):
        raw = graphed.prepare_raw([dict(o) for o in _observations(seed)])
        noise = graphed.make_noise(raw.batch_size, seed=seed)
        expected = eager.run(raw, noise)
        # the captured kernels (inductor's, or cuBLAS's choice under capture) may sum in another order than eager's
        tolerance = pi0_tolerance(eager.config) * expected.abs().max().item()
        torch.testing.assert_close(graphed.run(raw, noise), expected, rtol=0, atol=tolerance)
    (call,) = graphed.whole_call.graphs
    assert len(call.buckets) == 1 and call.replays == 3


def _observations(seed, batch=1):
    rng = np.random.default_rng(seed)
    return [
        {
            "observation.images.base_0_rgb": rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8),
            "observation.images.left_wrist_0_rgb": rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8),
            "observation.state": rng.normal(size=8).astype(np.float32),
            "observation.language.tokens": rng.integers(1, 1000, size=12),
        }
        for _ in range(batch)
    ]
