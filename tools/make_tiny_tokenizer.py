#!/usr/bin/env python
"""Train ``embodied_accel/data/tiny_tokenizer.model``, the SentencePiece tokenizer of the tiny presets.

The tiny presets (``pi0-tiny``, ``pi05-tiny``) have a 1024-token vocabulary and seeded random weights, so no trained
tokenizer belongs to them; this one lets them take text instructions end to end. It is trained on a small English
corpus of robot instructions and pi0.5-style prompts (``tools/tiny_tokenizer/robot_instructions.txt``), with the
special ids of PaliGemma's tokenizer (pad 0, eos 1, bos 2, unk 3), ``"\\n"`` as its own piece (pi0 appends it to the
task), digits split one per piece (pi0.5's discretized state) and byte fallback, so any text encodes and every id is
below 1024. Training is single-threaded on an unshuffled corpus, so the file is rebuilt byte for byte::

    python tools/make_tiny_tokenizer.py            # writes the bundled file
    python tools/make_tiny_tokenizer.py --out X.model
    python tools/make_tiny_tokenizer.py --check    # exit 1 if the bundled file differs from a fresh build
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tools" / "tiny_tokenizer" / "robot_instructions.txt"
DEFAULT_OUT = REPO / "embodied_accel" / "data" / "tiny_tokenizer.model"
VOCAB_SIZE = (
    512  # <= the tiny presets' vocab_size (1024, embodied_accel/models/pi0/config.py); the corpus supports ~520
)


def train(corpus: Path = CORPUS, vocab_size: int = VOCAB_SIZE) -> bytes:
    """The serialized SentencePiece model trained on ``corpus`` (one sentence per line)."""
    import sentencepiece

    sentences = corpus.read_text(encoding="utf-8").splitlines()
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        user_defined_symbols=["\n"],
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the .model file")
    parser.add_argument("--check", action="store_true", help="compare a fresh build with --out instead of writing")
    args = parser.parse_args()
    model = train()
    if args.check:
        same = args.out.is_file() and args.out.read_bytes() == model
        print(f"{args.out}: {'matches' if same else 'DIFFERS FROM'} a fresh build")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(model)
    print(f"wrote {args.out} ({len(model) / 1024:.1f} KiB, {VOCAB_SIZE} pieces)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
