#!/usr/bin/env python
"""Token ids of a few full GR00T prompts from the official processor with the real Eagle (Qwen2) tokenizer.

NOT run by CI; run it with the Isaac-GR00T environment (see README.md beside this file)::

    ISAAC_GROOT=/path/to/Isaac-GR00T  V/bin/python tools/groot_reference/real_tokenizer_ids.py

It writes ``tests/fixtures/groot_real_tokenizer_ids.json``: for each case the instruction, the image sizes and the
ids the official ``Gr00tN1d6Processor`` + collator produce. ``tests/test_groot_processor.py`` compares our tokenizer
on the same vocabulary (read from the checkout named by ``ISAAC_GROOT``) against them; without a checkout that test
is skipped. The vocabulary itself is not copied into this repository.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
if "ISAAC_GROOT" not in os.environ:
    sys.exit("set ISAAC_GROOT to an Isaac-GR00T checkout at the N1.6 release (see tools/groot_reference/README.md)")
ISAAC_GROOT = Path(os.environ["ISAAC_GROOT"])
sys.path.insert(0, str(ISAAC_GROOT))
OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "groot_real_tokenizer_ids.json"

from gr00t.model.gr00t_n1d6.processing_gr00t_n1d6 import build_processor  # noqa: E402

CASES = [
    ("pick the pear from the counter and place it in the plate", [(256, 256)]),
    ("Pick up the RED block, then place it on the Plate!", [(480, 640), (480, 640)]),
    ("open the drawer  ", [(800, 1280)]),
    ("Übergib mir bitte die Tasse — danke. 2 cubes, 13 balls", [(240, 320)]),
]


def main() -> None:
    import re

    processor = build_processor("nvidia/Eagle-Block2A-2B-v2", {"trust_remote_code": True})
    from PIL import Image

    results = []
    for text, sizes in CASES:
        language = re.sub(r"[^\w\s]", "", text.lower())  # formalize_language, as the official processor does
        images = [Image.fromarray(np.zeros((h, w, 3), dtype=np.uint8)) for h, w in sizes]
        conversation = [{"role": "user", "content": [{"type": "text", "text": language}]
                         + [{"type": "image", "image": img} for img in images]}]  # fmt: skip
        prompt = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
        fetched, _ = processor.process_vision_info([conversation])
        ids = processor(text=[prompt], images=fetched, return_tensors="pt", padding=True)["input_ids"][0].tolist()
        results.append({"instruction": text, "resized": [list(np.asarray(i).shape[:2]) for i in fetched],
                        "prompt": prompt, "ids": ids})  # fmt: skip
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {OUT}: {[len(r['ids']) for r in results]} tokens")


if __name__ == "__main__":
    main()
