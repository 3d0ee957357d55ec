"""Real-time chunking's leftover mapping for GR00T against the official action encoder.

NOT run by CI. Run it with the Isaac-GR00T environment (see README.md beside this file); ``embodied_accel`` is
imported from this checkout::

    ISAAC_GROOT=/path/to/Isaac-GR00T  V/bin/python tools/groot_reference/check_rtc_inverse.py

A request's ``previous_actions`` (robot units, as the policy returns them) is mapped into the model's action space
by :func:`embodied_accel.models.groot.processor.encode_actions`, the inverse of the action decoding. The official
``StateActionProcessor.apply_action`` (what training normalizes its targets with: absolute → relative to the last
state, then per-key normalization and the outlier clip) does the same mapping. This script feeds both the official
decoded actions and raw states of the parity fixture (``tests/fixtures/groot_tiny``, both embodiments, both rows)
and prints the largest difference per action key. The one intended difference: with ``clip_outliers`` the
official encoder also clips mean/std keys to [-1, 1], which the decoder does not undo; ours inverts the decoder
exactly, so those entries are reported apart and left out of the comparison.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "groot_tiny"


def main() -> int:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    import make_fixtures as mf  # Isaac-GR00T on the path, with the fixture's patches
    from safetensors.torch import load_file

    from embodied_accel.models.groot.config import get_preset
    from embodied_accel.models.groot.processor import encode_actions, load_embodiment

    official = mf.processing.Gr00tN1d6Processor.from_pretrained(FIXTURE)
    official.eval()
    encoder = official.state_action_processor
    tensors = load_file(FIXTURE / "io.safetensors")
    config = get_preset("groot-tiny")
    worst = 0.0
    for tag in ("gr1", "libero_panda"):
        spec, _, _ = load_embodiment(FIXTURE, tag, config.max_state_dim, config.max_action_dim,
                                     config.action_horizon, config.max_num_embodiments)  # fmt: skip
        for row in range(2):
            actions = {a.key: tensors[f"{tag}.action.{a.key}"][row].numpy().astype(np.float64) for a in spec.actions}
            state = {s.key: tensors[f"{tag}.state.{s.key}"][row].numpy().astype(np.float64) for s in spec.state}
            theirs = encoder.apply_action(actions, tag, state=state)
            ours = encode_actions(spec, {k: v[None] for k, v in actions.items()},
                                  {k: v[None] for k, v in state.items()})[0]  # fmt: skip
            start = 0
            for a in spec.actions:
                expected, got = np.asarray(theirs[a.key]), ours[:, start : start + a.dim]
                start += a.dim
                error = np.abs(expected - got)
                note = ""
                if a.mean_std:
                    clipped = np.abs(expected) >= 1.0
                    error = np.where(clipped, 0.0, error)
                    note = f" ({int(clipped.sum())} entries clipped by the official encoder, left out)"
                worst = max(worst, float(error.max()))
                print(f"{tag} row {row} {a.key:>10}: max |official - ours| {error.max():.3g}{note}")
    print(f"largest difference: {worst:.3g}")
    return 0 if worst < 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
