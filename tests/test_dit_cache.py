"""The DiT cache layer: exactness, per-algorithm behaviour on synthetic trajectories, streams, limits, config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerances import rounding_tolerance

from embodied_accel.cache import (
    CacheConfig,
    CacheConfigError,
    CachedDiT,
    DiTCachePlan,
    SignalRecorder,
    cache_config_from_dict,
    fit_coefficients,
    fit_quality,
    load_cache_config,
)


def polynomial_plan(coeffs: list[float]) -> DiTCachePlan:
    """A block stack whose skippable part adds ``P(step) = Σ c_i step^i`` to the stream (ctx = the step)."""

    def rest(h, step):
        return h + sum(c * float(step) ** i for i, c in enumerate(coeffs)) * torch.ones_like(h)

    return DiTCachePlan(
        name="polynomial",
        embed=lambda x, step: x,
        first_block=lambda h, step: h + 0.001 * (step + 1),
        rest=rest,
        stream=lambda h: h,
        head=lambda out, step: out,
        modulated_input=lambda h, step: h + step,
    )


def run(cached, steps: int, x=None, stream=0, begin=True):
    if begin:
        cached.begin(steps)
    x = torch.zeros(4) if x is None else x
    return [cached(x, s, s, stream) for s in range(steps)]


def test_taylorseer_order1_forecasts_a_linear_residual_exactly():
    plan = polynomial_plan([0.5, 2.0])
    cached = CachedDiT(plan, CacheConfig(method="taylorseer", order=1, interval=3, warmup_steps=2, final_steps=1))
    outs = run(cached, 12)
    exact = [plan.full_step(torch.zeros(4), s) for s in range(12)]
    assert cached.session.report.reused_steps > 0
    # the forecast r_j + (r_j - r_i) * k / (j - i) rounds a few times at the residual's magnitude (<= 0.5 + 2 * 11)
    for ours, ref in zip(outs, exact, strict=True):
        torch.testing.assert_close(ours, ref, atol=rounding_tolerance(chain=4) * 23, rtol=0)


def test_taylorseer_error_falls_with_order_on_a_cubic_and_order0_is_reuse():
    plan = polynomial_plan([0.0, 0.3, -0.05, 0.004])
    exact = torch.stack([plan.full_step(torch.zeros(4), s) for s in range(30)])
    errors = []
    for order in (0, 1, 2, 3):
        cached = CachedDiT(plan, CacheConfig(method="taylorseer", order=order, interval=3, warmup_steps=4))
        outs = torch.stack(run(cached, 30))
        errors.append(float((outs - exact).abs().mean()))
        if order == 0:  # plain reuse: a reused step repeats the last computed residual (input x = 0 here)
            decisions = cached.session.report.decisions[0]
            for s in range(1, 30):
                if not decisions[s]:
                    last = max(i for i in range(s) if decisions[i])
                    assert torch.equal(outs[s], exact[last])
    assert errors[0] > errors[1] > errors[2] > errors[3]


@pytest.mark.parametrize(
    "config",
    [
        CacheConfig(method="fbcache", residual_diff_threshold=0.0),
        CacheConfig(method="teacache", rel_l1_thresh=0.0),
        CacheConfig(method="taylorseer", order=0, interval=1),
        CacheConfig(method="none"),
    ],
    ids=["fbcache-0", "teacache-0", "taylorseer-O0N1", "none"],
)
def test_exact_settings_reproduce_uncached_steps_bit_for_bit(config):
    plan = polynomial_plan([0.1, 0.7, 0.2])
    x = torch.randn(4, generator=torch.Generator().manual_seed(0))
    cached = CachedDiT(plan, config)
    outs = run(cached, 10, x)
    assert cached.session.report.reused_steps == 0
    for s, out in enumerate(outs):
        assert torch.equal(out, plan.full_step(x, s))


def test_fbcache_compares_with_the_last_computed_step_and_teacache_accumulates():
    plan = polynomial_plan([0.0, 1.0])
    fb = CachedDiT(plan, CacheConfig(method="fbcache", residual_diff_threshold=0.5, warmup_steps=1, final_steps=0))
    run(fb, 8)
    decisions = fb.session.report.decisions[0]
    signals = fb.session.report.signals[0]
    # the first-block residual is 0.001 * (step + 1): against the last computed step c's, |s - c| / (c + 1)
    assert any(not d for d in decisions)
    for s in range(1, 8):
        if signals[s] is not None:
            last = max(i for i in range(s) if decisions[i])
            # float32 residuals 0.001 * (n + 1): their difference magnifies their rounding by (s + last + 2) / |s - last|
            # <= 15, then a division
            assert signals[s] == pytest.approx(abs(s - last) / (last + 1), rel=rounding_tolerance(chain=16))
    tea = CachedDiT(plan, CacheConfig(method="teacache", rel_l1_thresh=0.25, coefficients=(1.0, 0.0), final_steps=0))
    run(tea, 8)
    assert tea.session.report.decisions[0] != [True] * 8


def test_streams_are_kept_apart_and_state_resets_per_generation():
    plan = polynomial_plan([0.2, 1.0, 0.1])
    config = CacheConfig(method="fbcache", residual_diff_threshold=0.3, final_steps=0)
    xa, xb = torch.full((4,), 1.0), torch.full((4,), -3.0)
    alone = {}
    for name, x in (("a", xa), ("b", xb)):
        cached = CachedDiT(plan, config)
        alone[name] = (run(cached, 9, x, name), cached.session.report.decisions[name])
    both = CachedDiT(plan, config)
    both.begin(9)
    outs = {"a": [], "b": []}
    for s in range(9):
        for name, x in (("a", xa), ("b", xb)):
            outs[name].append(both(x, s, s, name))
    for name in ("a", "b"):
        assert both.session.report.decisions[name] == alone[name][1]
        assert all(torch.equal(o, r) for o, r in zip(outs[name], alone[name][0], strict=True))
    first = both.session.report.decisions["a"]
    run(both, 9, xa, "a")  # a new generation: the same decisions again, no state carried over
    assert both.session.report.decisions["a"] == first
    with pytest.raises(RuntimeError, match="out of order"):
        both(xa, 5, 5, "a")


def test_warmup_final_and_reuse_limits():
    plan = polynomial_plan([0.0, 0.01])
    base = {"method": "taylorseer", "order": 1, "interval": 100}
    cached = CachedDiT(plan, cache_config_from_dict({**base, "warmup_steps": 3, "final_steps": 2}))
    run(cached, 10)
    assert cached.session.report.decisions[0] == [True, True, True, False, False, False, False, False, True, True]
    cached = CachedDiT(plan, cache_config_from_dict({**base, "final_steps": 0, "max_consecutive_cached_steps": 2}))
    run(cached, 10)
    d = cached.session.report.decisions[0]
    assert max(len(r) for r in "".join("x" if not c else " " for c in d).split()) <= 2
    cached = CachedDiT(plan, cache_config_from_dict({**base, "final_steps": 0, "max_cached_steps": 3}))
    run(cached, 10)
    assert cached.session.report.reused_steps == 3


def test_config_errors_name_the_field(tmp_path: Path):
    with pytest.raises(CacheConfigError, match="unknown key.*treshold"):
        cache_config_from_dict({"method": "fbcache", "treshold": 0.1})
    with pytest.raises(CacheConfigError, match="method"):
        cache_config_from_dict({"method": "magcache"})
    with pytest.raises(CacheConfigError, match="interval"):
        cache_config_from_dict({"method": "taylorseer", "interval": 0})
    with pytest.raises(CacheConfigError, match="residual_diff_threshold"):
        cache_config_from_dict({"method": "fbcache", "residual_diff_threshold": -1})
    with pytest.raises(CacheConfigError, match="coefficients"):
        cache_config_from_dict({"method": "teacache", "coefficients": "abc"})
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    with pytest.raises(CacheConfigError, match="not valid JSON"):
        load_cache_config(bad)
    good = tmp_path / "ok.json"
    good.write_text(json.dumps({"method": "teacache", "rel_l1_thresh": 0.2, "coefficients": [2.0, 0.1]}))
    assert load_cache_config(good).coefficients == (2.0, 0.1)


def test_teacache_calibration_recovers_a_known_relation():
    plan = polynomial_plan([0.0, 1.0, 0.3])
    recorder = SignalRecorder(plan)
    for seed in range(3):
        recorder.begin()
        x = torch.randn(4, generator=torch.Generator().manual_seed(seed)) + 5
        for s in range(12):
            recorder(x, s, s)
    assert len(recorder.pairs) == 3 * 11
    coefficients = fit_coefficients(recorder.pairs)
    assert len(coefficients) == 5
    assert fit_quality(recorder.pairs, coefficients) > 0.9
    assert fit_quality(recorder.pairs, (0.0, 0.0, 0.0, 0.0, float(np.mean([p[1] for p in recorder.pairs])))) < 0.01


# ---- the Ascend recipe's cache_config.json, as its write-up prints it (tests/fixtures/ascend_recipe)

RECIPE = Path(__file__).parent / "fixtures" / "ascend_recipe" / "cache_config.json"


def recipe_with(**changes) -> dict:
    data = json.loads(RECIPE.read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return data


def test_the_recipes_cache_config_is_read_as_written():
    assert load_cache_config(RECIPE) == CacheConfig(method="none")  # its cache_forward: NoCache
    fb = cache_config_from_dict(recipe_with(cache_forward="FBCache"))
    assert (fb.method, fb.residual_diff_threshold) == ("fbcache", 0.05)
    tea = cache_config_from_dict(recipe_with(cache_forward="TeaCache"))
    assert (tea.method, tea.rel_l1_thresh, tea.warmup_steps) == ("teacache", 0.1, 2)
    assert tea.coefficients == (733.226126, -401.131952, 67.5869174, -3.149879, 0.0961237896)
    taylor = cache_config_from_dict(recipe_with(cache_forward="Taylorseer"))
    assert (taylor.method, taylor.order, taylor.interval, taylor.warmup_steps, taylor.final_steps) == (
        "taylorseer", 3, 4, 1, 1)  # fmt: skip
    assert cache_config_from_dict(recipe_with(cache_forward="taylorseer", enable_separate_cfg=True)).separate_cfg


def test_skip_interval_steps_is_our_interval_and_the_tables_n_counts_reused_steps():
    """The recipe computes a step when (step - warmup + 1) % skip_interval_steps == 0: the same steps as our
    interval; its tables' "O1N5" (5 steps reused between computed ones) is interval 6."""
    steps, warmup = 20, 1
    for interval in (1, 2, 4, 6):
        config = cache_config_from_dict(recipe_with(cache_forward="Taylorseer", Taylorseer__skip_interval_steps=interval,
                                                    Taylorseer__n_derivatives=1, Taylorseer__cutoff_steps=0))  # fmt: skip
        cached = CachedDiT(polynomial_plan([0.5, 2.0]), config)
        run(cached, steps)
        recipe = [s < warmup or (s - warmup + 1) % interval == 0 for s in range(steps)]
        assert cached.session.report.decisions[0] == recipe, interval
    six = cache_config_from_dict(recipe_with(cache_forward="Taylorseer", Taylorseer__skip_interval_steps=6,
                                             Taylorseer__n_derivatives=1))  # fmt: skip
    assert six.describe() == "TaylorSeer order 1 interval 6 (O1N5)"


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"cache_forward": "DeepCache"}, "cache_forward: expected one of NoCache, FBCache, TeaCache, Taylorseer"),
        ({"cache_forward": "FBCache", "FBCache__threshold": 0.1}, "FBCache: unknown key.*threshold"),
        ({"cache_forward": "Taylorseer", "Taylorseer__skip_interval_steps": 0},
         "Taylorseer: skip_interval_steps: expected an integer >= 1"),
        ({"TeaCache__judge_input": "hidden_states"}, "TeaCache: judge_input: only 'modulated_inp'"),
        ({"FBCache__cache_name": "TeaCache"}, "FBCache: cache_name: expected 'FBCache'"),
        ({"extra": 1}, "unknown key.*extra"),
    ],
)
def test_a_bad_recipe_config_is_an_error_naming_the_key(tmp_path, changes, fragment):
    path = tmp_path / "cache_config.json"
    path.write_text(json.dumps(recipe_with(**changes)))
    with pytest.raises(CacheConfigError, match=fragment):
        load_cache_config(path)
