#!/usr/bin/env python
"""Generate the VGGT reference fixtures ``tests/fixtures/vggt_tiny`` and ``vggt_small`` from the official code.

NOT run by CI. Run it with a Python environment that can import the official ``vggt`` package from a local
checkout (torch, numpy, pillow, einops; see ``tools/vggt_reference/README.md``)::

    /path/to/venv/bin/python tools/vggt_reference/make_fixtures.py --vggt-repo /path/to/vggt
    /path/to/venv/bin/python tools/vggt_reference/make_fixtures.py --vggt-repo /path/to/vggt --size small

The script imports and drives upstream's own ``VGGT`` / ``Aggregator`` / heads; no upstream code is copied here.
Upstream's constructors fix most sizes inside the sub-modules, so the reduced model is assembled from upstream's
real classes with smaller arguments (in this process only):

* ``Aggregator(img_size=56, patch_size=14, embed_dim=32, depth=5, num_heads=4)``, whose DINOv2 patch embedding is
  replaced by upstream's ``DinoVisionTransformer`` at width 32, depth 2, 4 heads, 4 registers (the structure of
  ``vit_large``: LayerScale 1.0, bicubic antialiased position interpolation, no interpolation offset);
* ``CameraHead(dim_in=64, trunk_depth=1, num_heads=4)``;
* two ``DPTHead(dim_in=64, features=8, out_channels=[8, 16, 32, 32], intermediate_layer_idx=[1, 2, 3, 4])`` for
  points (``inv_log``) and depth (``exp``);
* ``TrackHead(dim_in=64, features=8, iters=2, corr_levels=3, corr_radius=2, hidden_size=32)`` whose DPT feature
  extractor takes the same layers and whose tracker is upstream's ``BaseTrackerPredictor`` at depth 2.

Every parameter (norm weights and biases, LayerScale, camera / register tokens included) is overwritten with
seeded random values, then the model runs in fp32 on the CPU (one thread) on 3 frames of 56x56 and 3
frames of 42x70 (a non-square size, so DINOv2's position embedding is interpolated), with 5 query points each.
The state dict is saved under upstream's key names (``model.safetensors``, the layout of ``VGGT-1B``'s
``model.pt`` / the commercial checkpoint's safetensors) with the mixin-style ``config.json``.

``--size small`` builds a model of a size no preset has (width 24, 3 + 3 blocks of 3 heads, MLP ratio 3, 2
registers, RoPE frequency 50; a DINOv2 of 1 block with 2 heads; a camera trunk of 2 blocks, 4 heads, MLP ratio 1;
DPT features 16, channels 8 / 12 / 16 / 24, layers 0 / 1 / 2 / 2; a tracker of 3 iterations over 2 correlation
levels of radius 3, hidden width 24), stores its weights in fp16 (rounded to fp16 before anything runs) and writes a
``config.json`` with upstream's mixin keys plus, per module, the constructor arguments that no tensor shows, which is
how a loader reads such a checkpoint's architecture. It runs two cases and skips the size-independent files.

For ``tiny`` it records the key and shape of every tensor of upstream's full-size ``VGGT()`` (``vggt1b_layout.json.gz``: the
released checkpoint's layout, built on the meta device), and runs upstream's ``load_and_preprocess_images``
(``crop`` and ``pad``) on three small synthetic PNGs it writes into the fixture, recording a SHA-256 of each
preprocessed tensor (values are k/255, so the hash of the uint8 image is exact): the processor test needs no
large arrays.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import types
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures"

# Must match the `vggt-tiny` preset of embodied_accel (models/vggt/config.py).
TINY = dict(
    img_size=56,
    patch_size=14,
    embed_dim=32,
    depth=5,
    num_heads=4,
    mlp_ratio=4.0,
    rope_freq=100,
    dino_depth=2,
    dino_heads=4,
    num_register_tokens=4,
    camera_trunk_depth=1,
    camera_heads=4,
    camera_mlp_ratio=4,
    dpt_features=8,
    dpt_out_channels=[8, 16, 32, 32],
    dpt_layers=[1, 2, 3, 4],
    track_features=8,
    track_iters=2,
    track_corr_levels=3,
    track_corr_radius=2,
    track_hidden=32,
    track_depth=2,
)
# A size no preset has: every count differs from the tiny one, and the DINOv2 / camera head counts differ from the
# aggregator's (so a loader must read them from config.json rather than assume).
SMALL = dict(
    img_size=42,
    patch_size=14,
    embed_dim=24,
    depth=3,
    num_heads=3,
    mlp_ratio=3.0,
    rope_freq=50,
    dino_depth=1,
    dino_heads=2,
    num_register_tokens=2,
    camera_trunk_depth=2,
    camera_heads=4,
    camera_mlp_ratio=1,
    dpt_features=16,
    dpt_out_channels=[8, 12, 16, 24],
    dpt_layers=[0, 1, 2, 2],
    track_features=8,
    track_iters=3,
    track_corr_levels=2,
    track_corr_radius=3,
    track_hidden=24,
    track_depth=1,
)
SIZES = {"tiny": TINY, "small": SMALL}
CASES = {
    "tiny": {"square": dict(frames=3, hw=(56, 56)), "wide": dict(frames=3, hw=(42, 70))},
    "small": {"square": dict(frames=2, hw=(42, 42)), "wide": dict(frames=2, hw=(28, 56))},
}
NUM_QUERIES = 5
MODEL_SEED, DATA_SEED = 1234, 4321
PREPROCESS_IMAGES = {"landscape.png": (45, 60, "RGB"), "portrait.png": (80, 37, "RGB"), "alpha.png": (50, 50, "RGBA")}


def _install_torchvision_stub() -> None:
    """``vggt.utils.load_fn`` imports torchvision only for ``transforms.ToTensor`` (PIL -> float CHW / 255); a CPU
    torch from PyPI cannot import PyPI's torchvision, so that one transform is provided here."""
    if "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401

        return
    except Exception:
        pass

    class ToTensor:
        def __call__(self, pic):
            array = np.asarray(pic, dtype=np.uint8)
            if array.ndim == 2:
                array = array[:, :, None]
            return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div(255.0)

    tv = types.ModuleType("torchvision")
    transforms = types.ModuleType("torchvision.transforms")
    transforms.ToTensor = ToTensor
    tv.transforms = transforms
    sys.modules["torchvision"] = tv
    sys.modules["torchvision.transforms"] = transforms


def build_upstream(t: dict):
    """A reduced VGGT of size ``t`` out of upstream's own classes (see the module docstring)."""
    from functools import partial

    from vggt.heads.camera_head import CameraHead
    from vggt.heads.dpt_head import DPTHead
    from vggt.heads.track_head import TrackHead
    from vggt.heads.track_modules.base_track_predictor import BaseTrackerPredictor
    from vggt.layers import MemEffAttention
    from vggt.layers.block import NestedTensorBlock
    from vggt.layers.vision_transformer import DinoVisionTransformer
    from vggt.models.aggregator import Aggregator
    from vggt.models.vggt import VGGT

    # The outer model's own aggregator has upstream's fixed 16 heads: built at a width they divide, then replaced.
    model = VGGT(img_size=t["img_size"], patch_size=t["patch_size"], embed_dim=16 * math.ceil(t["embed_dim"] / 16),
                 enable_camera=False, enable_point=False, enable_depth=False, enable_track=False)  # fmt: skip
    model.aggregator = Aggregator(
        img_size=t["img_size"], patch_size=t["patch_size"], embed_dim=t["embed_dim"], depth=t["depth"],
        num_heads=t["num_heads"], mlp_ratio=t["mlp_ratio"], num_register_tokens=t["num_register_tokens"],
        patch_embed="conv", rope_freq=t["rope_freq"],
    )  # fmt: skip
    model.aggregator.patch_embed = DinoVisionTransformer(
        img_size=t["img_size"], patch_size=t["patch_size"], embed_dim=t["embed_dim"], depth=t["dino_depth"],
        num_heads=t["dino_heads"], mlp_ratio=4, block_fn=partial(NestedTensorBlock, attn_class=MemEffAttention),
        num_register_tokens=t["num_register_tokens"], interpolate_antialias=True, interpolate_offset=0.0,
        block_chunks=0, init_values=1.0,
    )  # fmt: skip
    dim_in = 2 * t["embed_dim"]
    model.camera_head = CameraHead(dim_in=dim_in, trunk_depth=t["camera_trunk_depth"], num_heads=t["camera_heads"],
                                   mlp_ratio=t["camera_mlp_ratio"])  # fmt: skip
    dpt = dict(dim_in=dim_in, features=t["dpt_features"], out_channels=t["dpt_out_channels"],
               intermediate_layer_idx=t["dpt_layers"])  # fmt: skip
    model.point_head = DPTHead(output_dim=4, activation="inv_log", conf_activation="expp1", **dpt)
    model.depth_head = DPTHead(output_dim=2, activation="exp", conf_activation="expp1", **dpt)
    track = TrackHead(dim_in=dim_in, patch_size=t["patch_size"], features=t["track_features"], iters=t["track_iters"],
                      corr_levels=t["track_corr_levels"], corr_radius=t["track_corr_radius"],
                      hidden_size=t["track_hidden"])  # fmt: skip
    track.feature_extractor = DPTHead(dim_in=dim_in, patch_size=t["patch_size"], features=t["track_features"],
                                      out_channels=t["dpt_out_channels"], intermediate_layer_idx=t["dpt_layers"],
                                      feature_only=True, down_ratio=2, pos_embed=False)  # fmt: skip
    track.tracker = BaseTrackerPredictor(latent_dim=t["track_features"], predict_conf=True, stride=2,
                                         corr_levels=t["track_corr_levels"], corr_radius=t["track_corr_radius"],
                                         hidden_size=t["track_hidden"], depth=t["track_depth"])  # fmt: skip
    model.track_head = track
    return model.eval()


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Seeded random values for every parameter, chosen so every weight matters and activations stay O(1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = tuple(param.shape)
            leaf = name.rsplit(".", 1)[-1]
            randn = torch.randn(shape, generator=gen)
            if leaf == "gamma":  # LayerScale
                value = 0.5 + 0.1 * randn
            elif "norm" in name and leaf == "weight" and len(shape) == 1:
                value = 1.0 + 0.1 * randn
            elif leaf == "bias" or (("norm" in name) and leaf == "bias"):
                value = 0.05 * randn
            elif leaf in ("camera_token", "register_token", "cls_token", "register_tokens", "mask_token",
                          "empty_pose_tokens", "query_ref_token", "virual_tracks"):  # fmt: skip
                value = 0.5 * randn
            elif leaf == "pos_embed":
                value = 0.2 * randn
            elif len(shape) >= 2:  # linear / conv / transposed conv weights, MHA in_proj
                fan_in = shape[1] * math.prod(shape[2:]) if "resize_layers" not in name else shape[0]
                value = randn / math.sqrt(max(fan_in, 1))
            else:
                value = 0.1 * randn
            param.copy_(value)
        # Keep the pose encoding well conditioned: small FoV rows, FoV bias ~ 1 rad (relu'd), and small track
        # updates, so that random weights give finite intrinsics and tracks that stay near the image.
        fc2 = model.camera_head.pose_branch.fc2
        fc2.weight[7:].mul_(0.1)
        fc2.bias[7:] = 1.0 + 0.05 * torch.randn(2, generator=gen)
        model.track_head.tracker.updateformer.flow_head.weight.mul_(0.05)
        model.track_head.tracker.updateformer.flow_head.bias.mul_(0.05)


def make_inputs(seed: int, cases: dict) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    inputs = {}
    for case, spec in cases.items():
        h, w = spec["hw"]
        inputs[f"{case}.images"] = torch.rand((spec["frames"], 3, h, w), generator=gen)
        scale = torch.tensor([w - 1, h - 1], dtype=torch.float32)
        inputs[f"{case}.query_points"] = torch.rand((NUM_QUERIES, 2), generator=gen) * scale
    return inputs


def write_preprocess_images(out: Path) -> list[Path]:
    from PIL import Image

    paths = []
    for i, (name, (h, w, mode)) in enumerate(sorted(PREPROCESS_IMAGES.items())):
        yy, xx = np.mgrid[0:h, 0:w]
        rgb = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((xx + yy + 40 * i) % 256)], -1)
        if mode == "RGBA":
            alpha = ((xx + yy) * 255 // (h + w - 2)).astype(np.uint8)
            image = Image.fromarray(np.concatenate([rgb.astype(np.uint8), alpha[..., None]], -1), "RGBA")
        else:
            image = Image.fromarray(rgb.astype(np.uint8), "RGB")
        path = out / "preprocess" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        paths.append(path)
    return paths


def tensor_digest(images: torch.Tensor) -> dict:
    """Exact fingerprint of a preprocessed batch (values are k/255): the SHA-256 of its uint8 image."""
    as_uint8 = torch.round(images * 255.0).to(torch.uint8).contiguous().numpy()
    assert np.array_equal(as_uint8.astype(np.float32) / 255.0, images.numpy()), "values are not k/255"
    return {"shape": list(images.shape), "sha256": hashlib.sha256(as_uint8.tobytes()).hexdigest()}


def write_full_size_layout(path: Path) -> int:
    """Key and shape of every tensor of upstream's full-size ``VGGT()`` (the layout of ``VGGT-1B``), gzipped JSON.

    Built on the meta device (no memory): DINOv2's constructor reads a ``linspace`` with ``.item()``, so that one
    call is made on the CPU.
    """
    import gzip

    from vggt.models.vggt import VGGT

    linspace = torch.linspace
    torch.linspace = lambda *a, **k: linspace(*a, **{**k, "device": "cpu"})
    try:
        with torch.device("meta"):
            model = VGGT()
    finally:
        torch.linspace = linspace
    layout = {key: list(value.shape) for key, value in model.state_dict().items()}
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(layout, f, separators=(",", ":"), sort_keys=True)
    return len(layout)


def hub_config(t: dict, size: str) -> dict:
    """``config.json``: upstream's mixin keys; for a size no preset has, also the constructor arguments per module
    that no tensor shows (the sections ``embodied_accel.models.vggt.architecture`` reads)."""
    config = {"img_size": t["img_size"], "patch_size": t["patch_size"], "embed_dim": t["embed_dim"]}
    if size == "tiny":
        return config
    return {
        **config,
        "aggregator": {"rope_freq": t["rope_freq"]},
        "patch_embed": {"num_heads": t["dino_heads"]},
        "camera_head": {"num_heads": t["camera_heads"], "num_iterations": 4},
        "dpt_head": {"intermediate_layer_idx": t["dpt_layers"]},
        "track_head": {"iters": t["track_iters"], "corr_levels": t["track_corr_levels"],
                       "corr_radius": t["track_corr_radius"]},
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vggt-repo", type=Path, required=True, help="local checkout of the official vggt repository")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--out", type=Path, default=None, help="default: tests/fixtures/vggt_<size>")
    args = parser.parse_args()
    args.out = args.out or FIXTURES / f"vggt_{args.size}"
    t, cases = SIZES[args.size], CASES[args.size]
    sys.path.insert(0, str(args.vggt_repo.resolve()))
    _install_torchvision_stub()
    from safetensors.torch import save_file
    from vggt.utils.load_fn import load_and_preprocess_images

    args.out.mkdir(parents=True, exist_ok=True)
    model = build_upstream(t)
    randomize_(model, MODEL_SEED)
    # The small fixture is stored in fp16 (as released checkpoints often are) to stay small: its weights are rounded
    # to fp16 first, so the file holds exactly what the reference outputs are computed with (in fp32).
    stored = torch.float16 if args.size == "small" else torch.float32
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(stored).float())
    state = {k: v.detach().to(stored).contiguous() for k, v in model.state_dict().items()}
    save_file(state, args.out / "model.safetensors")
    (args.out / "config.json").write_text(json.dumps(hub_config(t, args.size), indent=2) + "\n")

    inputs = make_inputs(DATA_SEED, cases)
    outputs: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for case in cases:
            pred = model(inputs[f"{case}.images"], query_points=inputs[f"{case}.query_points"])
            for key in ("pose_enc", "depth", "depth_conf", "world_points", "world_points_conf", "track", "vis", "conf"):
                outputs[f"{case}.{key}"] = pred[key].contiguous()
            for i, enc in enumerate(pred["pose_enc_list"]):
                outputs[f"{case}.pose_enc_iter{i}"] = enc.clone()
            if not torch.isfinite(torch.cat([t.flatten() for t in pred.values() if torch.is_tensor(t)])).all():
                raise SystemExit(f"non-finite reference output in case {case}")
    save_file({**inputs, **outputs}, args.out / "io.safetensors")

    preprocess = {}
    if args.size == "tiny":  # size-independent: once
        paths = write_preprocess_images(args.out)
        for mode in ("crop", "pad"):
            for path in paths:
                preprocess[f"{mode}/{path.name}"] = tensor_digest(load_and_preprocess_images([str(path)], mode=mode))
            preprocess[f"{mode}/all"] = tensor_digest(load_and_preprocess_images([str(p) for p in paths], mode=mode))

    upstream_sha = None
    head = args.vggt_repo / ".git" / "HEAD"
    if head.is_file():
        upstream_sha = head.read_text().strip()
    meta = {
        f"{args.size}_config": t,
        "cases": {k: {"frames": v["frames"], "hw": list(v["hw"])} for k, v in cases.items()},
        "num_queries": NUM_QUERIES,
        "model_seed": MODEL_SEED,
        "data_seed": DATA_SEED,
        **({"preprocess": preprocess} if preprocess else {}),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "vggt_checkout": upstream_sha,
        },  # fmt: skip
    }
    (args.out / "io.json").write_text(json.dumps(meta, indent=2) + "\n")

    full_keys = write_full_size_layout(args.out / "vggt1b_layout.json.gz") if args.size == "tiny" else None

    # Self-check: strict reload into a fresh upstream model reproduces the outputs exactly.
    from safetensors.torch import load_file

    check = build_upstream(t)
    check.load_state_dict(load_file(args.out / "model.safetensors"), strict=True)
    with torch.no_grad():
        again = check(inputs["square.images"], query_points=inputs["square.query_points"])
    assert torch.equal(again["depth"], outputs["square.depth"]), "reloaded model differs"
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({total / 1024:.0f} KiB, {sum(v.numel() for v in state.values())} parameters; "
          f"full-size layout: {full_keys or 'not written'} tensors)")  # fmt: skip
    for key, value in outputs.items():
        print(f"  {key:28s} {tuple(value.shape)} mean {value.float().mean():+.4f} std {value.float().std():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
