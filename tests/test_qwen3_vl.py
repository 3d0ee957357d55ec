"""Qwen3-VL backbone (GR00T N1.7): parity with the upstream wrapper's fixture, its mutations, bad inputs, configs.

``tests/fixtures/qwen3_vl_tiny`` comes from ``tools/groot_reference/make_qwen3_vl_fixture.py`` (Isaac-GR00T N1.7's
``Qwen3Backbone`` over transformers 4.57.3, seeded random weights): a batch of two left-padded prompts, one image of
two frames in row 0 and two images of different grids (one of them with the first image's patch count) in row 1.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import FIXTURES
from safetensors.torch import load_file, save_file
from tolerances import fp32_tolerance, scaled_error
from triton_setup import DEVICE, GPU, requires_triton  # sets TRITON_INTERPRET on a machine without a GPU

from embodied_accel.errors import CheckpointError
from embodied_accel.models.loading import Rule, load_into, open_safetensors
from embodied_accel.nn.qwen3_vl import (
    COSMOS_REASON2_2B,
    UNUSED_CHECKPOINT_KEYS,
    Qwen3VLBackbone,
    Qwen3VLConfig,
    mrope_channel_axes,
    position_ids,
)
from embodied_accel.ops import get_ops

FIXTURE = FIXTURES / "qwen3_vl_tiny"
META = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
CONFIG = Qwen3VLConfig.from_hf_config(META["qwen3_vl_config"])
SELECT = META["select_layer"]
#: The longest sums of the call: the merger's 4 x 32 = 128-wide GEMMs (patch embedding 96, text MLP 80, attention
#: over at most 24 keys); a value passes the patch embedding, 2 vision blocks, the merger and 3 text layers.
STAGES, REDUCTION = 7, 128
TOLERANCE = fp32_tolerance(STAGES, REDUCTION)


def load_backbone(select_layer: int = SELECT, path=FIXTURE / "model.safetensors", ops=None, device="cpu"):
    """The backbone built on ``meta`` and loaded strictly through its checkpoint entries."""
    with torch.device("meta"):
        backbone = Qwen3VLBackbone(CONFIG, ops or get_ops("reference"), select_layer)
    rules = [Rule(**entry.as_rule_fields()) for entry in backbone.weight_entries(META["checkpoint_prefix"])]
    load_into(backbone, open_safetensors(path), rules, heading="qwen3-vl fixture does not match:", device=device,
              dtype=torch.float32, ignored=backbone.unused_checkpoint_prefixes(META["checkpoint_prefix"]),
              progress=False)  # fmt: skip
    return backbone


@pytest.fixture(scope="module")
def backbone() -> Qwen3VLBackbone:
    return load_backbone()


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    return load_file(FIXTURE / "inputs.safetensors")


@pytest.fixture(scope="module")
def outputs() -> dict[str, torch.Tensor]:
    return load_file(FIXTURE / "outputs.safetensors")


def run(backbone: Qwen3VLBackbone, inputs, buffers=None, device="cpu") -> torch.Tensor:
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    buffers = buffers or backbone.build_buffers(inputs["image_grid_thw"], *ids.shape, device)
    with torch.no_grad():
        return backbone(ids, mask, inputs["pixel_values"], buffers)


def valid_error(ours: torch.Tensor, inputs, reference: torch.Tensor) -> float:
    valid = inputs["attention_mask"].bool()
    return scaled_error(ours[valid], reference[valid])


# ---------------------------------------------------------------------------------------------------------------
# Parity
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parity
def test_position_ids_equal_upstream(inputs, outputs):
    ours = position_ids(inputs["input_ids"], inputs["image_grid_thw"], inputs["attention_mask"],
                        image_token_id=CONFIG.image_token_id, spatial_merge_size=CONFIG.spatial_merge_size)  # fmt: skip
    assert torch.equal(ours, outputs["position_ids"])


def loop_positions(ids: list[int], valid: list[bool], grids: list[tuple[int, int, int]], merge: int) -> list:
    """One row's (t, h, w) positions token by token (``grids``: this row's images, in order)."""
    positions, next_position, image, k = [], 0, 0, 0
    for token, keep in zip(ids, valid, strict=True):
        if not keep:
            positions.append((1, 1, 1))
        elif token != CONFIG.image_token_id:
            positions.append((next_position,) * 3)
            next_position += 1
        else:
            t, h, w = grids[image][0], grids[image][1] // merge, grids[image][2] // merge
            positions.append((next_position + k // (h * w), next_position + k // w % h, next_position + k % w))
            k += 1
            if k == t * h * w:
                next_position, image, k = next_position + max(t, h, w), image + 1, 0
    return positions


def test_position_ids_follow_the_token_by_token_rule(inputs, outputs):
    """Random prompts (images of random grids anywhere, text-only rows, any left padding) against a loop that gives
    the upstream positions of the fixture."""
    grids = [tuple(g) for g in inputs["image_grid_thw"].tolist()]
    for r, row_grids in enumerate((grids[:1], grids[1:])):
        expected = loop_positions(inputs["input_ids"][r].tolist(), inputs["attention_mask"][r].bool().tolist(),
                                  row_grids, CONFIG.spatial_merge_size)  # fmt: skip
        assert outputs["position_ids"][:, r].t().tolist() == [list(p) for p in expected]
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        rows, grids, layouts = [], [], []
        for _ in range(3):
            row, row_grids = [], []
            for _ in range(int(torch.randint(0, 3, (1,), generator=generator))):
                grid = (int(torch.randint(1, 3, (1,), generator=generator)),
                        *(2 * int(v) for v in torch.randint(1, 4, (2,), generator=generator)))  # fmt: skip
                words = int(torch.randint(0, 3, (1,), generator=generator))
                text = torch.randint(0, CONFIG.vision_start_token_id, (words,), generator=generator).tolist()
                row += text + [CONFIG.vision_start_token_id] + [CONFIG.image_token_id] * (math.prod(grid) // 4)
                row_grids.append(grid)
            rows.append(row + [5])
            layouts.append(row_grids)
            grids += row_grids
        if not grids:
            continue
        length = max(len(row) for row in rows) + int(torch.randint(0, 3, (1,), generator=generator))
        ids = torch.zeros(len(rows), length, dtype=torch.int64)
        mask = torch.zeros(len(rows), length, dtype=torch.int64)
        for r, row in enumerate(rows):
            ids[r, length - len(row) :], mask[r, length - len(row) :] = torch.tensor(row), 1
        ours = position_ids(ids, torch.tensor(grids), mask, image_token_id=CONFIG.image_token_id)
        for r in range(len(rows)):
            expected = loop_positions(ids[r].tolist(), mask[r].bool().tolist(), layouts[r], CONFIG.spatial_merge_size)
            assert ours[:, r].t().tolist() == [list(p) for p in expected]


@pytest.mark.parity
def test_vision_tower_matches_upstream(backbone, inputs, outputs):
    buffers = backbone.build_buffers(inputs["image_grid_thw"], *inputs["input_ids"].shape, "cpu")
    assert [run.frames for run in buffers.vision.runs] == [2, 1, 1]  # (4, 6) twice, then (6, 4) and (4, 4)
    with torch.no_grad():
        tokens, deepstack = backbone.vision(inputs["pixel_values"], buffers.vision)
    assert scaled_error(tokens, outputs["image_embeds"]) < TOLERANCE
    assert len(deepstack) == len(CONFIG.deepstack_visual_indexes)
    for i, feature in enumerate(deepstack):
        assert scaled_error(feature, outputs[f"deepstack_{i}"]) < TOLERANCE


@pytest.mark.parity
def test_features_match_upstream_wrapper(backbone, inputs, outputs):
    ours = run(backbone, inputs)
    assert ours.shape == outputs["features"].shape
    assert bool(torch.isfinite(ours).all())  # padded rows too (they attend to nothing)
    error = valid_error(ours, inputs, outputs["features"])
    assert error < TOLERANCE, f"scaled error {error:.2e} (bound {TOLERANCE:.2e})"


@pytest.mark.parity
def test_bound_catches_a_wrong_mrope_section(backbone, inputs, outputs):
    buffers = backbone.build_buffers(inputs["image_grid_thw"], *inputs["input_ids"].shape, "cpu")
    wrong = replace(buffers, channel_axes=mrope_channel_axes(CONFIG.head_dim, (2, 3, 3)))
    assert valid_error(run(backbone, inputs, wrong), inputs, outputs["features"]) > 10 * TOLERANCE


@pytest.mark.parity
def test_bound_catches_a_missing_deepstack_add(backbone, inputs, outputs, monkeypatch):
    tower_forward = backbone.vision.forward
    monkeypatch.setattr(backbone.vision, "forward", lambda pixels, buffers: (tower_forward(pixels, buffers)[0], []))
    assert valid_error(run(backbone, inputs), inputs, outputs["features"]) > 10 * TOLERANCE


@pytest.mark.parity
def test_bound_catches_one_layer_too_few_and_the_final_norm(backbone, inputs, outputs):
    assert valid_error(run(load_backbone(SELECT - 1), inputs), inputs, outputs["features"]) > 10 * TOLERANCE
    # the wrapper's output is the last kept layer before the final norm, which the fixture also holds
    assert valid_error(outputs["final_normed"], inputs, outputs["features"]) > 10 * TOLERANCE


@requires_triton
@pytest.mark.kernels
def test_cuda_backend_matches_upstream_with_no_fallback(inputs, outputs):
    """The fused kernels (rope on the vision QKV, q/k-norm + RoPE, attention): on the GPU where there is one, else
    under the Triton interpreter."""
    from embodied_accel.ops import fallbacks

    backbone = load_backbone(ops=get_ops("cuda", GPU), device=DEVICE)
    with fallbacks.counting() as seen:
        ours = run(backbone, {name: tensor.to(DEVICE) for name, tensor in inputs.items()}, device=DEVICE)
    assert seen == {}, seen
    assert valid_error(ours.cpu(), inputs, outputs["features"]) < TOLERANCE


def test_compiled_forward_equals_eager_without_recompiling(backbone, inputs):
    """One graph per bucket (no break, no host sync): another padding of the same shapes reuses it."""
    buffers = backbone.build_buffers(inputs["image_grid_thw"], *inputs["input_ids"].shape, "cpu")
    ids, mask, pixels = inputs["input_ids"], inputs["attention_mask"], inputs["pixel_values"]
    more_padding = mask.clone()
    more_padding[0, 3] = 0  # row 0's first text token becomes padding: other positions, same shapes
    torch._dynamo.reset()
    compiled = torch.compile(backbone, fullgraph=True, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(ids, mask, pixels, buffers), backbone(ids, mask, pixels, buffers))
        with torch._dynamo.config.patch(error_on_recompile=True):
            again = compiled(ids, more_padding, pixels, buffers)
        assert torch.equal(again, backbone(ids, more_padding, pixels, buffers))


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint layout
# ---------------------------------------------------------------------------------------------------------------


def test_checkpoint_entries_account_for_every_fixture_key(backbone):
    prefix = META["checkpoint_prefix"]
    entries = backbone.checkpoint_entries(prefix)
    reader = open_safetensors(FIXTURE / "model.safetensors")
    unused = backbone.unused_checkpoint_prefixes(prefix)
    assert set(entries) == {key for key in reader.keys() if not key.startswith(unused)}
    assert {f"{prefix}{key}" for key in UNUSED_CHECKPOINT_KEYS} <= set(reader.keys())
    for key, (target, shape) in entries.items():
        assert reader.shape(key) == shape, key
        assert target in dict(backbone.named_parameters()), target
    assert entries[f"{prefix}model.language_model.layers.0.self_attn.k_proj.weight"][0] == "layers.0.qkv.weight_t"
    assert f"{prefix}model.language_model.layers.{SELECT}." in unused  # the layers past select_layer


def test_strict_load_names_a_missing_tensor(tmp_path):
    state = load_file(FIXTURE / "model.safetensors")
    key = "backbone.model.model.visual.deepstack_merger_list.1.linear_fc2.bias"
    del state[key]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="deepstack_merger_list.1.linear_fc2.bias"):
        load_backbone(path=tmp_path / "model.safetensors")


def test_cosmos_reason2_2b_entries_are_the_released_layout():
    with torch.device("meta"):
        backbone = Qwen3VLBackbone(COSMOS_REASON2_2B, get_ops("reference"), select_layer=12)
    entries = backbone.checkpoint_entries()
    assert entries["backbone.model.model.visual.patch_embed.proj.weight"][1] == (1024, 3, 2, 16, 16)
    assert entries["backbone.model.model.visual.deepstack_merger_list.2.norm.weight"][1] == (4096,)
    assert entries["backbone.model.model.language_model.layers.11.self_attn.k_proj.weight"][1] == (1024, 2048)
    assert "backbone.model.model.language_model.layers.12.mlp.up_proj.weight" not in entries
    assert {target for target, _ in entries.values()} == {name for name, _ in backbone.named_parameters()}


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


def test_check_inputs_accepts_the_fixture(backbone, inputs):
    ids, mask, pixels, grids = (inputs[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw"))
    backbone.check_inputs(ids, mask, pixels, grids)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(pixel_values=d["pixel_values"][:-1]), r"pixel_values: expected \[88, 96\]"),
        (lambda d: d.update(image_grid_thw=torch.tensor([[2, 4, 6], [1, 4, 4], [1, 6, 4]])), "runs of image tokens"),
        (lambda d: d.update(image_grid_thw=torch.tensor([[2, 4, 5], [1, 6, 4], [1, 4, 4]])), "multiples of"),
        (lambda d: d.update(attention_mask=d["attention_mask"][:, 1:]), "attention_mask: shape"),
        (lambda d: d.update(attention_mask=d["attention_mask"] * 2), "attention_mask: expected 0/1"),
        (lambda d: d.update(input_ids=d["input_ids"].float()), "input_ids: expected int64"),
        (lambda d: d["input_ids"].__setitem__((0, 5), 999), r"token ids must lie in \[0, 192\)"),
        (lambda d: d["input_ids"].__setitem__((1, 6), 7), "do not follow a vision-start token"),
        (lambda d: d["input_ids"].__setitem__((0, 0), 190), "at a padded position"),
        (lambda d: d["input_ids"].__setitem__((1, 5), 191), "video token 191 found"),
    ],
)
def test_check_inputs_names_the_bad_field(backbone, inputs, change, message):
    bad = {name: tensor.clone() for name, tensor in inputs.items()}
    change(bad)
    with pytest.raises(ValueError, match=message):
        backbone.check_inputs(bad["input_ids"], bad["attention_mask"], bad["pixel_values"], bad["image_grid_thw"])


def test_select_layer_and_buffers_are_checked(backbone, inputs):
    with pytest.raises(ValueError, match="select_layer 5: expected 1 .. 4"):
        Qwen3VLBackbone(CONFIG, get_ops("reference"), 5)
    buffers = backbone.build_buffers(inputs["image_grid_thw"], 2, 20, "cpu")
    with pytest.raises(ValueError, match=r"input_ids: shape \[2, 24\], but the buffers are for \[2, 20\]"):
        backbone.check_buffers(inputs["input_ids"], inputs["pixel_values"], buffers)
    swapped = inputs["image_grid_thw"][[0, 2, 1]]
    with pytest.raises(ValueError, match=r"image_grid_thw \[\[2, 4, 6\], \[1, 4, 4\], \[1, 6, 4\]\], but the buffers"):
        backbone.check_buffers(inputs["input_ids"], inputs["pixel_values"], buffers, swapped)


# ---------------------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------------------

#: The architecture fields of Cosmos-Reason2-2B's config.json (as LeRobot 0.6.1's GR00T N1.7 port bundles it).
COSMOS_CONFIG_JSON = {
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "text_config": {
        "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936, "rope_theta": 5000000,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
    },
    "vision_config": {
        "depth": 24, "hidden_size": 1024, "num_heads": 16, "intermediate_size": 4096, "patch_size": 16,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 2048, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [5, 11, 17], "in_channels": 3, "hidden_act": "gelu_pytorch_tanh",
    },
}  # fmt: skip


def test_from_hf_config_reads_the_2b_config():
    assert Qwen3VLConfig.from_hf_config(COSMOS_CONFIG_JSON) == COSMOS_REASON2_2B


def _edited(path: str, value):
    d = json.loads(json.dumps(COSMOS_CONFIG_JSON))
    *parents, leaf = path.split(".")
    target = d
    for name in parents:
        target = target[name]
    if value is KeyError:
        del target[leaf]
    else:
        target[leaf] = value
    return d


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("text_config.hidden_size", KeyError, "text_config.hidden_size: missing"),
        ("vision_config", KeyError, "vision_config: missing"),
        ("text_config.rope_scaling", KeyError, "text_config.rope_scaling: missing"),
        ("text_config.rope_scaling.mrope_section", [24, 20], "mrope_section"),
        ("text_config.rope_scaling.rope_type", "yarn", "rope_type: 'yarn'"),
        ("text_config.num_key_value_heads", 3, "not a multiple of num_kv_heads 3"),
        ("text_config.num_attention_heads", "16", "text_config.num_attention_heads: '16'"),
        ("vision_config.deepstack_visual_indexes", [5, 24], r"\[24\] outside the 24 blocks"),
        ("vision_config.num_position_embeddings", 2300, "not a square"),
        ("vision_config.out_hidden_size", 1024, "out_hidden_size 1024 != text hidden_size 2048"),
        ("vision_config.hidden_act", "gelu", "vision_config.hidden_act"),
    ],
)
def test_from_hf_config_names_a_bad_field(path, value, message):
    with pytest.raises(ValueError, match=message):
        Qwen3VLConfig.from_hf_config(_edited(path, value))
