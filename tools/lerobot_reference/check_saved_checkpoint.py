#!/usr/bin/env python
"""Does LeRobot 0.6.1 read a checkpoint our trainer wrote, and compute what we compute with it?

NOT run by CI. Run it with the Python that has ``lerobot[pi]==0.6.1`` (embodied_accel is imported from this checkout)::

    V/bin/python tools/lerobot_reference/check_saved_checkpoint.py RUN/checkpoints/last/pretrained_model [...]

For each directory (a fine-tune of a tiny preset: LeRobot is patched to the tiny sizes exactly as make_fixtures.py
does, in this process only): ``PI0Policy`` / ``PI05Policy.from_pretrained`` with ``strict=True`` (its own
``config.json`` parsed by LeRobot's config classes; every key of ``model.safetensors`` must load: LeRobot returns a
randomly initialized model when loading fails, so the outputs are compared too), its saved pre- and post-processor
pipelines loaded with ``PolicyProcessorPipeline.from_pretrained`` and their normalization statistics compared with
ours, then ``sample_actions`` of both on the same inputs and noise. Prints one line per directory; exit code 1 on any
mismatch.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import make_fixtures as mf  # noqa: E402
from lerobot.processor import NormalizerProcessorStep, PolicyProcessorPipeline  # noqa: E402
from lerobot.processor.converters import batch_to_transition, transition_to_batch  # noqa: E402

from embodied_accel import load_policy  # noqa: E402

TOLERANCE = 1e-4


def _without_tokenizer(directory: Path, scratch: Path) -> Path:
    """The checkpoint's files but its tokenizer.model (LeRobot's environment has no sentencepiece; token ids are given
    here, no text is tokenized)."""
    view = scratch / directory.name
    view.mkdir(parents=True, exist_ok=True)
    for item in directory.iterdir():
        if item.name != "tokenizer.model":
            (view / item.name).symlink_to(item.resolve())
    return view


def check(directory: Path, scratch: Path) -> bool:
    ours = load_policy(str(_without_tokenizer(directory, scratch)), backend="reference", progress=False)
    family = ours.family
    cls = mf.modeling_pi0.PI0Policy if family == "pi0" else mf.modeling_pi05.PI05Policy
    theirs = cls.from_pretrained(str(directory), strict=True)
    theirs.eval()
    pre = PolicyProcessorPipeline.from_pretrained(
        directory, config_filename="policy_preprocessor.json", to_transition=batch_to_transition,
        to_output=transition_to_batch,
    )  # fmt: skip
    normalizer = next(s for s in pre.steps if isinstance(s, NormalizerProcessorStep))
    stats_ok = all(
        torch.allclose(torch.as_tensor(normalizer.stats[ours.io.state_key][name]).float(),
                       torch.from_numpy(value))  # fmt: skip
        for name, value in ours.io.state_stats.items()
        if name in normalizer.stats[ours.io.state_key]
    )
    gen = torch.Generator().manual_seed(0)
    cfg = ours.config
    batch, cameras, size = 2, len(ours.io.image_keys), cfg.vision.image_size
    images = torch.rand(batch, cameras, 3, size, size, generator=gen) * 2 - 1
    masks = torch.ones(batch, cameras, dtype=torch.bool)
    tokens = torch.randint(1, cfg.vocab_size, (batch, cfg.max_token_len), generator=gen)
    token_masks = torch.arange(cfg.max_token_len)[None].expand(batch, -1) < torch.tensor([[12], [20]])
    state = torch.randn(batch, cfg.max_state_dim, generator=gen)
    noise = torch.randn(batch, cfg.action_horizon, cfg.max_action_dim, generator=gen)
    with torch.no_grad():
        mine = ours.model.sample_actions(images, masks, tokens, token_masks, state, noise)
        args = [list(images.unbind(1)), list(masks.unbind(1)), tokens, token_masks]
        if family == "pi0":
            args.append(state)
        reference = theirs.model.sample_actions(*args, noise=noise.clone())
    difference = (mine - reference).abs().max().item()
    ok = difference <= TOLERANCE and stats_ok
    print(f"{directory}: {family}, LeRobot from_pretrained(strict=True) + processors loaded; sample_actions max abs "
          f"difference {difference:.2e}; normalizer statistics {'equal' if stats_ok else 'DIFFER'} -> "
          f"{'OK' if ok else 'MISMATCH'}")  # fmt: skip
    return ok


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    mf.install_patches()
    with tempfile.TemporaryDirectory() as scratch:
        results = [check(Path(arg), Path(scratch) / str(i)) for i, arg in enumerate(sys.argv[1:])]
    raise SystemExit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
