"""The runtime's limits and device plumbing: compiled shape buckets beyond dynamo's default limit (never a silent
eager fallback), the cap on CUDA graphs with least-recently-used eviction (through the CPU replay stand-in), one
graph cache per policy, one loaded model wrapped in several capture modes, and platform queries, captures and
calls on the model's own device. The last tests need a GPU."""

from __future__ import annotations

import logging

import pytest
import torch
from test_cudagraph import GPU, ReplayStandIn, _observations, raw_batch

from embodied_accel import load_policy
from embodied_accel.bench import harness
from embodied_accel.models.random_weights import SeededDraws
from embodied_accel.runtime.buffers import StaticBuffers
from embodied_accel.runtime.compiled import CompiledCall
from embodied_accel.runtime.cudagraph import CudaGraphBackend
from embodied_accel.runtime.runner import BucketedCall


def counting_backend():
    """A ``torch.compile`` backend that records each graph it is given and runs it as traced (no inductor)."""
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    return backend, graphs


def affine(x):
    return torch.sin(x) * 2 + 1


@pytest.mark.compile
def test_more_shape_buckets_than_dynamos_default_limit_are_all_compiled():
    """dynamo's default allows 8 graphs per function, then runs it eagerly without an error: every bucket here
    (10) gets its graph, and repeated calls compile nothing new."""
    backend, graphs = counting_backend()
    call = CompiledCall(affine, max_buckets=16, backend=backend)
    buckets = torch._dynamo.config.recompile_limit + 2
    for size in range(1, buckets + 1):
        torch.testing.assert_close(call(torch.full((size,), 0.5)), affine(torch.full((size,), 0.5)))
    assert len(graphs) == buckets and call.compiled_buckets == buckets and call.eager_fallbacks == 0
    for size in range(1, buckets + 1):
        call(torch.zeros(size))
    assert len(graphs) == buckets


@pytest.mark.compile
def test_buckets_beyond_the_limit_run_eagerly_counted_and_logged(caplog):
    backend, graphs = counting_backend()
    call = CompiledCall(affine, max_buckets=2, backend=backend)
    with caplog.at_level(logging.WARNING, logger="embodied_accel.runtime.compiled"):
        for size in (1, 2, 3, 3, 1):
            torch.testing.assert_close(call(torch.ones(size)), affine(torch.ones(size)))
    assert len(graphs) == 2 and call.compiled_buckets == 2 and call.eager_fallbacks == 2
    assert caplog.text.count("this new bucket runs eagerly") == 1  # one warning per refused bucket
    with pytest.raises(ValueError, match="max_buckets"):
        CompiledCall(affine, max_buckets=0)


def test_graph_cap_evicts_the_least_recently_used_capture(caplog):
    policy = load_policy("pi0-tiny", progress=False)
    standin = ReplayStandIn()
    graphed = policy.with_capture("cudagraph", plat=GPU, graph_backend=standin, max_graphs=2)
    assert graphed.model is policy.model and graphed.buffers is not policy.buffers and graphed.capture == "cudagraph"
    calls = (graphed.whole_call, graphed.model_call, graphed.whole_call_rtc, graphed.model_call_rtc)
    assert all(call.graph_cache is graphed.graph_cache for call in calls)  # one cache (and pool) for the policy
    graphed.reserve(3)  # one KV cache for batches 1-3: the three buckets below share it
    raws = [raw_batch(policy, seed, batch) for seed, batch in ((0, 1), (1, 2), (2, 3))]
    noises = [policy.make_noise(raw.batch_size, seed=seed) for seed, raw in enumerate(raws)]

    def run(i):
        out = graphed.run(raws[i], noises[i])
        torch.testing.assert_close(out, policy.run(raws[i], noises[i]), rtol=0, atol=0)

    with caplog.at_level(logging.INFO, logger="embodied_accel.runtime.cudagraph"):
        run(0), run(1), run(0)  # bucket 0 is now the most recently used
        run(2)  # the cap is 2: bucket 1 goes
        assert (graphed.graph_cache.captures, graphed.graph_cache.evictions, graphed.graph_cache.live) == (3, 1, 2)
        run(0)  # still held: replayed
        assert standin.captures == 3
        run(1)  # evicted: captured again, evicting bucket 2
        assert standin.captures == 4 and graphed.graph_cache.evictions == 2 and graphed.graph_cache.live == 2
    assert caplog.text.count("captured a graph") == 4 and caplog.text.count("evicted the least recently used") == 2
    with pytest.raises(ValueError, match="max_graphs"):
        policy.with_capture("cudagraph", plat=GPU, graph_backend=standin, max_graphs=0)


def test_real_graphs_of_a_policy_share_one_backend_on_its_device():
    """Without a stand-in, the policy's calls share one CUDA graph backend (one memory pool) for its device."""
    policy = load_policy("groot-tiny", progress=False)
    graphed = policy.with_capture("cudagraph", plat=GPU)
    backend = graphed.graph_cache.backend
    assert isinstance(backend, CudaGraphBackend) and backend.device == policy.device
    assert graphed.model_call.graph_cache is graphed.model_call_rtc.graph_cache is graphed.graph_cache
    assert policy.with_capture("eager").graph_cache is None


def test_calls_run_under_the_models_device(monkeypatch):
    """A call (and so its capture) enters the model's device, whatever the calling thread's current device is."""
    entered = []

    class RecordingDevice:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", RecordingDevice)
    call = BucketedCall(lambda buffers, x: x * 2, lambda bucket: {}, dict, mode="cudagraph", buffers=StaticBuffers(),
                        plat=GPU, graph_backend=ReplayStandIn(), device="cuda:1")  # fmt: skip
    torch.testing.assert_close(call("bucket", torch.ones(3)), torch.full((3,), 2.0))
    assert entered == [torch.device("cuda", 1)]


def test_platform_queries_go_to_the_models_device(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: seen.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: seen.append(("peak", device)) or 2**20)
    second = GPU.for_device("cuda:1")
    second.synchronize(), second.reset_peak_memory()
    assert second.peak_memory_mb() == 1.0
    GPU.synchronize("cuda:2")
    assert seen == [("sync", 1), ("reset", 1), ("peak", 1), ("sync", 2)]
    with pytest.raises(ValueError, match="expected a cuda device"):
        GPU.for_device("cpu")


def test_seeded_draws_do_not_depend_on_the_thread_count():
    """Large CPU draws are split into chunks with their own generators: the same values on 1 or 2 threads, the
    requested mean and standard deviation, and the [out, in] memory of a loaded linear weight when transposed."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = SeededDraws(7, "cpu").uniform((3000, 3000), std=0.02, mean=0.5, dtype=torch.bfloat16, transposed=True)
        torch.set_num_threads(2)
        two = SeededDraws(7, "cpu").uniform((3000, 3000), std=0.02, mean=0.5, dtype=torch.bfloat16, transposed=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two) and one.stride() == (1, 3000)
    values = one.float()
    # 9e6 draws: the sample mean and std are within 1e-4 relative of the requested ones; bf16 rounding adds 2^-9
    assert abs(values.mean().item() - 0.5) < 1e-3 and abs(values.std().item() / 0.02 - 1) < 1e-2
    assert values.min().item() >= 0.5 - 0.02 * 3**0.5 - 1e-2 and values.max().item() <= 0.5 + 0.02 * 3**0.5 + 1e-2
    other = SeededDraws(8, "cpu").uniform((3000, 3000), std=0.02, mean=0.5, dtype=torch.bfloat16, transposed=True)
    assert not torch.equal(one, other)


# ---------------------------------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_evicted_cuda_graphs_are_recaptured_and_equal_eager_on_the_gpu():
    eager = load_policy("pi0-tiny", device="cuda", progress=False)
    graphed = eager.with_capture("cudagraph", max_graphs=1)
    for seed, batch in ((0, 1), (1, 2), (2, 1), (3, 2)):  # every call evicts the other bucket's graph
        raw = graphed.prepare_raw(_observations(seed, batch))
        noise = graphed.make_noise(batch, seed=seed)
        torch.testing.assert_close(graphed.run(raw, noise), eager.run(raw, noise), rtol=1e-4, atol=1e-4)
    assert graphed.graph_cache.captures == 4 and graphed.graph_cache.evictions == 3 and graphed.graph_cache.live == 1


@pytest.mark.gpu
def test_device_activity_under_cuda_graphs_on_the_gpu():
    """Under graphs, launches are the host's (a handful per call) and the busy fraction comes from replay events."""
    eager = load_policy("pi0-tiny", device="cuda", progress=False)
    graphed = eager.with_capture("cudagraph")
    observations = _observations(0, 1)
    eager_call, _ = eager.measured_call(observations)
    graphed_call, _ = graphed.measured_call(observations)
    graphed_call()  # capture
    eager_kernels, eager_busy = harness.device_activity(eager_call)
    graph_launches, graph_busy = harness.device_activity(graphed_call)
    assert 0 < graph_launches < eager_kernels / 10, (graph_launches, eager_kernels)
    assert 0 < eager_busy <= 1 and 0 < graph_busy <= 1


@pytest.mark.gpu
def test_random_weights_are_drawn_on_the_gpu():
    first = SeededDraws(3, "cuda").uniform((1000, 200), std=0.1, dtype=torch.bfloat16, transposed=True)
    again = SeededDraws(3, "cuda").uniform((1000, 200), std=0.1, dtype=torch.bfloat16, transposed=True)
    assert first.is_cuda and torch.equal(first, again) and first.stride() == (1, 1000)
    assert abs(first.float().std().item() / 0.1 - 1) < 0.02
    policy = load_policy("pi0-tiny", device="cuda", progress=False)
    assert all(p.is_cuda for p in policy.model.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second NVIDIA GPU")
def test_a_policy_on_the_second_gpu_captures_there():
    eager = load_policy("pi0-tiny", device="cuda:1", progress=False)
    graphed = eager.with_capture("cudagraph")
    raw = graphed.prepare_raw(_observations(0, 1))
    noise = graphed.make_noise(1, seed=0)
    torch.testing.assert_close(graphed.run(raw, noise), eager.run(raw, noise), rtol=1e-4, atol=1e-4)
    assert graphed.run(raw, noise).device == torch.device("cuda", 1)
