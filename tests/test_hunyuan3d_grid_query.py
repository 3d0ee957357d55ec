"""The geometry decoder's grid form (models/hunyuan3d/grid_query.py) and the volume decoding around it: equal to
the direct form on every config variant, by spans and by scattered points, with and without the (j, k) plane
table; the workspace changes nothing; refinement takes spans only where they are dense; hierarchical decoding
switches to the dense grid when the surface is everywhere."""

from __future__ import annotations

import math

import pytest
import torch
from tolerances import rounding_tolerance

from embodied_accel.models.hunyuan3d import grid_query, volume
from embodied_accel.models.hunyuan3d.config import VaeConfig
from embodied_accel.models.hunyuan3d.model import ShapeVaeDecoder
from embodied_accel.ops import get_ops

RESOLUTION, CHUNK = 10, 100  # 11³ = 1331 points; chunks cross x-slabs (121 points) and run past the grid's end


def tiny_decoder(qk_norm: bool, ln_post: bool, seed: int = 0) -> tuple[ShapeVaeDecoder, grid_query.GeometryKV]:
    cfg = VaeConfig(num_latents=16, embed_dim=8, width=32, heads=2, num_decoder_layers=1, num_freqs=4,
                    qk_norm=qk_norm, geo_decoder_ln_post=ln_post)  # fmt: skip
    vae = ShapeVaeDecoder(cfg, get_ops("reference"))
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, param in vae.named_parameters():
        if param.ndim >= 2:
            value = torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[0])
        elif name.endswith("bias"):
            value = 0.1 * torch.randn(param.shape, generator=generator)
        else:
            value = 1.0 + 0.1 * torch.randn(param.shape, generator=generator)
        state[name] = value
    vae.load_state_dict(state, strict=True, assign=True)
    vae.eval()
    with torch.no_grad():
        kv = vae.geometry_kv(vae.decode_latents(torch.randn(1, 16, 8, generator=generator)))
    return vae, kv


def bound(reference: torch.Tensor) -> float:
    """The grid form sums the direct form's terms in another grouping (biases folded over a row of ones, per-axis
    plane sums): the longest sum is the decoder MLP's 128 hidden units, about 4 dependent layers (query embedding,
    cross-attention, MLP, output), relative to the largest value."""
    return rounding_tolerance(terms=128, chain=4) * float(reference.abs().max())


def grid_form(vae, kv, chunk: int = CHUNK, work: bool = True) -> grid_query.GridFormDecoder:
    folded = grid_query.fold(vae, kv)
    workspace = grid_query.GridWorkspace.allocate(vae, chunk, "cpu") if work else None
    return grid_query.GridFormDecoder(vae, 1.01, chunk, "cpu",
                                      lambda tokens: grid_query.decode(vae, tokens, folded, workspace))  # fmt: skip


def direct_grid(vae, kv) -> torch.Tensor:
    return volume.decode_dense(volume.point_query(lambda p: vae.query(p, kv)[0], 1.01, "cpu"), RESOLUTION, 64, "cpu")


@pytest.mark.parametrize("qk_norm,ln_post", [(True, True), (False, True), (True, False), (False, False)])
@torch.no_grad()
def test_grid_form_equals_direct_form_by_spans_and_by_points(qk_norm, ln_post):
    vae, kv = tiny_decoder(qk_norm, ln_post)
    assert grid_query.applies(vae)
    reference = direct_grid(vae, kv)
    decoder = grid_form(vae, kv)
    assert decoder.cheap_spans(RESOLUTION)
    dense = volume.decode_dense(decoder, RESOLUTION, CHUNK, "cpu")
    assert float((dense - reference).abs().max()) <= bound(reference)
    # scattered points (every third one: too sparse for spans) and all points (every chunk a dense span)
    for flat in (torch.arange(0, reference.numel(), 3), torch.arange(reference.numel())):
        values = volume.query_points(decoder, flat, RESOLUTION, CHUNK)
        assert float((values - reference.view(-1)[flat]).abs().max()) <= bound(reference)


@torch.no_grad()
def test_without_the_plane_table_spans_and_points_gather_the_three_axes(monkeypatch):
    vae, kv = tiny_decoder(True, True)
    reference = direct_grid(vae, kv)
    monkeypatch.setattr(grid_query, "PLANE_TABLE_BYTES", 0)
    decoder = grid_form(vae, kv)
    assert not decoder.cheap_spans(RESOLUTION)
    assert float((volume.decode_dense(decoder, RESOLUTION, CHUNK, "cpu") - reference).abs().max()) <= bound(reference)
    flat = torch.arange(5, reference.numel(), 7)
    values = volume.query_points(decoder, flat, RESOLUTION, CHUNK)
    assert float((values - reference.view(-1)[flat]).abs().max()) <= bound(reference)


@torch.no_grad()
def test_the_workspace_gives_the_allocating_decode_bit_for_bit_and_is_reused():
    vae, kv = tiny_decoder(True, True)
    folded = grid_query.fold(vae, kv)
    work = grid_query.GridWorkspace.allocate(vae, CHUNK, "cpu")
    tables = grid_query.axis_tables(vae, volume.axis_coordinates(RESOLUTION, 1.01, "cpu"))
    tokens = torch.empty(32, CHUNK)
    for start in (0, 1300):
        grid_query.embed_span(tables, start, tokens)
        before = tokens.clone()
        with_work = grid_query.decode(vae, tokens, folded, work)
        assert with_work.data_ptr() == work.logits.data_ptr()  # written into the workspace
        assert torch.equal(tokens, before)  # the input is left as it was (a captured call's static input)
        assert torch.equal(with_work, grid_query.decode(vae, tokens, folded))
    assert torch.equal(work.normed[-1], torch.ones(CHUNK)) and torch.equal(work.hidden[-1], torch.ones(CHUNK))


class CountingDecoder(volume.GridDecoder):
    """A decoder whose logit at a point is its flat index; counts its span and points calls."""

    def __init__(self, cheap: bool = True):
        super().__init__("cpu")
        self.cheap, self.calls = cheap, {"span": 0, "points": 0}

    def points(self, flat_index, resolution):
        self.calls["points"] += 1
        return flat_index.float()

    def span(self, start, size, resolution):
        self.calls["span"] += 1
        return torch.arange(start, start + size, dtype=torch.float32)

    def cheap_spans(self, resolution):
        return self.cheap


def test_refinement_takes_a_span_only_where_enough_of_it_is_wanted():
    dense_run = torch.arange(1000, 1000 + 4 * CHUNK)  # four chunks' worth, consecutive
    sparse = torch.arange(2000, 2000 + 4 * CHUNK * 2, 2)  # half of each span wanted
    gappy = torch.cat([torch.arange(3000, 3000 + CHUNK)[: int(volume.SPAN_DENSITY * CHUNK) - 1],
                       torch.tensor([3000 + CHUNK + 5])])  # fmt: skip
    for flat, spans, points in ((dense_run, 4, 0), (sparse, 0, 4), (gappy, 0, 1)):
        decoder = CountingDecoder()
        assert torch.equal(volume.query_points(decoder, flat, 20, CHUNK), flat.float())
        assert decoder.calls == {"span": spans, "points": points}
    decoder = CountingDecoder(cheap=False)
    assert torch.equal(volume.query_points(decoder, dense_run, 20, CHUNK), dense_run.float())
    assert decoder.calls == {"span": 0, "points": 4}


class EverywhereDecoder(volume.GridDecoder):
    """A surface at every scale: a sign pattern that flips between neighbouring points at any resolution."""

    def __init__(self):
        super().__init__("cpu")
        self.queried = 0

    def points(self, flat_index, resolution):
        self.queried += flat_index.numel()
        n = resolution + 1
        i, j, k = flat_index // (n * n), flat_index // n % n, flat_index % n
        return ((i + j + k) % 2 * 2 - 1).float()


def test_hierarchical_decoding_goes_dense_when_the_surface_is_everywhere():
    decoder = EverywhereDecoder()
    grid, stats = volume.decode_hierarchical(decoder, 16, 64, "cpu", min_resolution=4)
    assert torch.equal(grid, volume.decode_dense(EverywhereDecoder(), 16, 64, "cpu"))
    assert stats["queried_points"] == 5**3 + 17**3  # the coarsest grid, then the finest one densely
