"""The tokenizer of a pi0 / pi0.5 policy, where to find it, and the prompts pi0 and pi0.5 build from an instruction.

Checkpoints use the PaliGemma SentencePiece tokenizer (``google/paligemma-3b-pt-224``, gated on the Hugging Face hub,
so it is not bundled): :func:`find_tokenizer` looks for it where a user already has it. The tiny presets, which
have no trained vocabulary, use a small tokenizer bundled with the library (``embodied_accel/data``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import DATA_DIR, Pi0Config

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.model"
#: The tokenizer LeRobot's pi0 / pi0.5 processors load (``TokenizerProcessorStep(tokenizer_name=...)``).
PALIGEMMA_REPO = "google/paligemma-3b-pt-224"
#: Other Hugging Face repositories with the same tokenizer: every PaliGemma (1) model shares one SentencePiece model.
PALIGEMMA_REPO_PATTERN = "models--google--paligemma-3b-*"
PREPROCESSOR_FILE = "policy_preprocessor.json"


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
        """Number of pieces: every id the tokenizer gives is below it."""
        return int(self._sp.GetPieceSize())

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *self._sp.EncodeAsIds(text)]


# ---------------------------------------------------------------------------------------------------------------
# Where a tokenizer is found
# ---------------------------------------------------------------------------------------------------------------


def hub_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache, as ``huggingface_hub`` resolves it: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
    else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    env = os.environ if environ is None else environ
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # the second: its older name
        if env.get(variable):
            return Path(env[variable]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def _snapshot_files(repo_dir: Path) -> list[Path]:
    """``tokenizer.model`` of a cached repo's snapshots: the one ``refs/main`` names first, then the newest."""
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return []
    ordered = []
    main_ref = repo_dir / "refs" / "main"
    if main_ref.is_file():
        ordered.append(snapshots / main_ref.read_text(encoding="utf-8").strip())
    others = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    ordered += [p for p in others if p not in ordered]
    return [snapshot / TOKENIZER_FILE for snapshot in ordered if (snapshot / TOKENIZER_FILE).is_file()]


def checkpoint_tokenizer_name(checkpoint_dir: str | Path) -> str | None:
    """The ``tokenizer_name`` a LeRobot checkpoint's saved pre-processor names (e.g. ``google/paligemma-3b-pt-224``),
    or None when it names none."""
    path = Path(checkpoint_dir) / PREPROCESSOR_FILE
    try:
        pipeline = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # io_spec reports a broken pre-processor file
    steps = pipeline.get("steps") if isinstance(pipeline, dict) else None
    for step in steps if isinstance(steps, list) else []:
        if isinstance(step, dict) and step.get("registry_name") == "tokenizer_processor":
            name = (step.get("config") or {}).get("tokenizer_name")
            return name if isinstance(name, str) and name else None
    return None


@dataclass
class TokenizerSearch:
    """What :func:`search_tokenizer` found, and every place it looked (for messages)."""

    tokenizer: Tokenizer | None
    searched: list[str] = field(default_factory=list)  # "PLACE (what was there)"

    def describe_searched(self) -> str:
        return "; ".join(self.searched)


def search_tokenizer(
    config: Pi0Config,
    *,
    explicit: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> TokenizerSearch:
    """Find the tokenizer of a policy; see :func:`find_tokenizer` for the order. Raises ``ValueError`` for an
    explicit or checkpoint tokenizer that cannot be used (missing, unreadable, more pieces than the vocabulary)."""
    vocab = config.vocab_size
    if explicit is not None:
        path = Path(explicit)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        return TokenizerSearch(_load_fitting(path, vocab, "tokenizer"), [f"{path} (given)"])
    searched: list[str] = []
    if checkpoint_dir is not None:
        beside = Path(checkpoint_dir) / TOKENIZER_FILE
        if beside.is_file():
            return TokenizerSearch(_load_fitting(beside, vocab, "the checkpoint's tokenizer"), [f"{beside} (found)"])
        searched.append(f"{beside} (absent)")
    elif config.bundled_tokenizer is not None:
        bundled = DATA_DIR / config.bundled_tokenizer
        return TokenizerSearch(_load_fitting(bundled, vocab, "the bundled tokenizer"), [f"{bundled} (bundled)"])

    cache = hub_cache_dir(environ)
    named = checkpoint_tokenizer_name(checkpoint_dir) if checkpoint_dir is not None else None
    repos = [named] if named else []
    repos += [PALIGEMMA_REPO] if PALIGEMMA_REPO not in repos else []
    candidates: list[tuple[str, list[Path]]] = []
    for repo in repos:
        local = Path(repo).expanduser()
        if local.is_dir():  # LeRobot also accepts a local tokenizer directory as tokenizer_name
            candidates.append((f"{local}", [local / TOKENIZER_FILE] if (local / TOKENIZER_FILE).is_file() else []))
        else:
            candidates.append((f"{cache / _repo_folder(repo)}", _snapshot_files(cache / _repo_folder(repo))))
    if cache.is_dir():
        seen = {place for place, _ in candidates}
        for repo_dir in sorted(cache.glob(PALIGEMMA_REPO_PATTERN)):
            if str(repo_dir) not in seen:
                candidates.append((str(repo_dir), _snapshot_files(repo_dir)))
    for place, files in candidates:
        if not files:
            searched.append(f"{place} (no {TOKENIZER_FILE})")
        for path in files:
            try:
                tokenizer = Tokenizer.from_file(path)
            except (ValueError, ImportError) as exc:
                searched.append(f"{path} (unusable: {exc})")
                continue
            if tokenizer.vocab_size > vocab:
                searched.append(f"{path} ({tokenizer.vocab_size} pieces, more than the model's {vocab} tokens)")
                continue
            return TokenizerSearch(tokenizer, [*searched, f"{path} (found in the Hugging Face cache)"])
    return TokenizerSearch(None, searched)


def _load_fitting(path: Path, vocab_size: int, what: str) -> Tokenizer:
    tokenizer = Tokenizer.from_file(path)
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"{what} {path} has {tokenizer.vocab_size} pieces, but the model's vocabulary has {vocab_size} tokens: "
            "it is not this model's tokenizer"
        )
    return tokenizer


def locate_tokenizer(
    config: Pi0Config,
    *,
    explicit: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> TokenizerSearch:
    """The tokenizer a policy of ``config`` uses for text (None: only token ids work), and where it was looked for.

    In order: ``explicit`` (``--tokenizer``: a ``tokenizer.model`` or its directory), the checkpoint directory, a
    preset's bundled tokenizer, then the Hugging Face hub cache (:func:`hub_cache_dir`): the repository the
    checkpoint's preprocessor names, then ``google/paligemma-3b-*``. A tokenizer with more pieces than the model's
    vocabulary is skipped (an error when explicit or in the checkpoint). Logs the choice, or every place searched.
    ``environ`` replaces ``os.environ`` (tests).
    """
    search = search_tokenizer(config, explicit=explicit, checkpoint_dir=checkpoint_dir, environ=environ)
    if search.tokenizer is not None:
        logger.info("%s: tokenizer %s, %d pieces", config.name, search.searched[-1], search.tokenizer.vocab_size)
    else:
        logger.warning(
            "%s: no tokenizer found, so text instructions cannot be tokenized (token ids still work); searched: %s. "
            "Pass tokenizer= / --tokenizer with PaliGemma's %s, or send token ids in 'observation.language.tokens'",
            config.name, search.describe_searched(), TOKENIZER_FILE,
        )  # fmt: skip
    return search


def find_tokenizer(
    config: Pi0Config,
    *,
    explicit: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Tokenizer | None:
    """The tokenizer :func:`locate_tokenizer` finds, or None."""
    return locate_tokenizer(config, explicit=explicit, checkpoint_dir=checkpoint_dir, environ=environ).tokenizer


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
