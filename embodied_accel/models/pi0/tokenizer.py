"""The PaliGemma tokenizer and the prompts pi0 and pi0.5 build from an instruction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_FILE = "tokenizer.model"


class Tokenizer:
    """The PaliGemma SentencePiece tokenizer (bos prepended, no eos).

    ``encode`` gives the ids of LeRobot's ``TokenizerProcessorStep`` (the Hugging Face PaliGemma tokenizer with
    ``add_special_tokens``, before padding): ``[bos] + sentencepiece ids``.
    """

    def __init__(self, processor: Any, source: str = "<sentencepiece>") -> None:
        self._sp = processor
        self.source = source
        self.bos_id = int(processor.bos_id())
        if self.bos_id < 0:
            raise ValueError(f"{source}: the SentencePiece model defines no bos token")

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a SentencePiece ``.model`` file."""
        path = Path(path)
        try:
            import sentencepiece
        except ImportError:
            raise ImportError(
                "reading a tokenizer needs the sentencepiece package: pip install sentencepiece "
                "(or embodied-accel[tokenizer]), or pass token ids in 'observation.language.tokens'"
            ) from None
        if not path.is_file():
            raise ValueError(f"tokenizer file {path} does not exist")
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except Exception as e:  # sentencepiece raises OSError / RuntimeError depending on version
            raise ValueError(f"{path}: not a readable SentencePiece model ({e})") from None
        return cls(processor, source=str(path))

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> Tokenizer | None:
        """The checkpoint's ``tokenizer.model``, or None if it has none."""
        path = Path(checkpoint_dir) / TOKENIZER_FILE
        return cls.from_file(path) if path.is_file() else None

    @property
    def vocab_size(self) -> int:
        return int(self._sp.GetPieceSize())

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *self._sp.EncodeAsIds(text)]


def pi05_prompt(task: str, normalized_state: np.ndarray) -> str:
    """LeRobot / openpi's pi0.5 prompt: the task and the normalized (unpadded) state in 256 bins over [-1, 1].

    Bin ``i`` covers ``[-1 + i/128, -1 + (i+1)/128)``; values below -1 give -1 and values of 1 or more give 255
    (``np.digitize`` semantics, no clipping, as upstream).
    """
    bins = np.digitize(np.asarray(normalized_state), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(map(str, bins.tolist()))};\nAction: "


def format_prompt(family: str, task: str, normalized_state: np.ndarray) -> str:
    """The text a policy tokenizes: pi0 ``task + "\\n"`` (LeRobot's ``Pi0NewLineProcessor``), pi0.5
    :func:`pi05_prompt`."""
    if family == "pi05":
        return pi05_prompt(task, normalized_state)
    return task if task.endswith("\n") else task + "\n"
