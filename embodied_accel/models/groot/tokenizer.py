"""The Qwen2 byte-level BPE tokenizer and chat template of GR00T N1.6's Eagle backbone, read from its files.

A checkpoint holds no tokenizer: :meth:`QwenTokenizer.from_dir` reads ``vocab.json``, ``merges.txt``, the added
tokens and ``chat_template.json`` from an Isaac-GR00T checkout's ``gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2/``
or any directory holding them (NFC, Qwen2 pre-tokenizer, byte-level BPE, added tokens first). Needs ``tokenizers``
and ``jinja2`` (``pip install 'embodied-accel[groot]'``). ``groot-tiny`` uses the reference fixture's small BPE,
bundled in ``embodied_accel/data/groot_tiny_tokenizer`` (``<IMG_CONTEXT>`` = 346), so it takes text instructions.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs, newlines, spaces).
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
#: Where the tokenizer lives inside an Isaac-GR00T checkout.
CHECKOUT_SUBDIR = Path("gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2")
#: The tokenizers bundled with the library, by preset (see the module docstring).
PRESET_TOKENIZERS = {"groot-tiny": Path(__file__).resolve().parents[2] / "data" / "groot_tiny_tokenizer"}
REQUIRED_FILES = ("vocab.json", "merges.txt", "chat_template.json")
EXTRA = "pip install 'embodied-accel[groot]'"


class TokenizerError(ValueError):
    """Tokenizer files missing, unreadable or inconsistent."""


def find_tokenizer_dir(path: str | Path) -> Path | None:
    """The directory holding the tokenizer files: ``path`` itself or the Eagle directory of a checkout at ``path``."""
    path = Path(path)
    for candidate in (path, path / CHECKOUT_SUBDIR):
        if all((candidate / name).is_file() for name in REQUIRED_FILES):
            return candidate
    return None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: not a readable JSON file ({exc})") from None


class QwenTokenizer:
    """``encode(text) -> ids``, ``token_id(token)``, ``render_chat(instruction, num_images)``."""

    def __init__(self, directory: Path):
        try:
            import jinja2.sandbox
            from tokenizers import (
                AddedToken,
                Regex,
                Tokenizer,
                decoders,
                models,
                normalizers,
                pre_tokenizers,
            )
        except ImportError as exc:
            raise ImportError(
                f"the GR00T tokenizer needs the tokenizers and jinja2 packages: {EXTRA} ({exc})"
            ) from None
        self.directory = directory
        self.source = str(directory)  # where it was read from (the CLI reports it)
        vocab = _read_json(directory / "vocab.json")
        merges = []
        for line in (directory / "merges.txt").read_text(encoding="utf-8").splitlines():
            if line.startswith("#version") or not line.strip():
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise TokenizerError(f"{directory / 'merges.txt'}: malformed merge line {line!r}")
            merges.append((parts[0], parts[1]))
        bpe = models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
        tokenizer = Tokenizer(bpe)
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()

        config_path = directory / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        added = config.get("added_tokens_decoder")
        if added:
            entries = sorted(((int(i), e) for i, e in added.items()), key=lambda item: item[0])
        elif (directory / "added_tokens.json").is_file():
            table = _read_json(directory / "added_tokens.json")
            entries = sorted(((int(i), {"content": c, "special": True}) for c, i in table.items()), key=lambda x: x[0])
        else:
            raise TokenizerError(
                f"{directory}: no added tokens (tokenizer_config.json added_tokens_decoder or added_tokens.json)"
            )
        for token_id, entry in entries:
            token = AddedToken(
                entry["content"],
                single_word=bool(entry.get("single_word", False)),
                lstrip=bool(entry.get("lstrip", False)),
                rstrip=bool(entry.get("rstrip", False)),
                normalized=bool(entry.get("normalized", not entry.get("special", True))),
                special=bool(entry.get("special", True)),
            )
            tokenizer.add_tokens([token])
            if tokenizer.token_to_id(entry["content"]) != token_id:
                raise TokenizerError(
                    f"{directory}: added token {entry['content']!r} should have id {token_id}, got "
                    f"{tokenizer.token_to_id(entry['content'])} (vocab.json and the added tokens "
                    "disagree)"
                )
        self._tokenizer = tokenizer
        pad = config.get("pad_token", "<|endoftext|>")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_id = tokenizer.token_to_id(pad) if pad is not None else None
        template = _read_json(directory / "chat_template.json")
        template = template.get("chat_template") if isinstance(template, dict) else None
        if not isinstance(template, str):
            raise TokenizerError(f"{directory / 'chat_template.json'}: expected {{'chat_template': '...'}}")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(template)

    @classmethod
    def from_dir(cls, path: str | Path) -> QwenTokenizer:
        directory = find_tokenizer_dir(path)
        if directory is None:
            raise TokenizerError(
                f"tokenizer {path}: no {', '.join(REQUIRED_FILES)} there or under {CHECKOUT_SUBDIR} "
                "(point it at an Isaac-GR00T checkout or its Eagle-Block2A-2B-v2 directory)"
            )
        return cls(directory)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return len(self)

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def render_chat(self, instruction: str, num_images: int) -> str:
        """The chat template applied to one user turn: the instruction, then ``num_images`` images."""
        content = [{"type": "text", "text": instruction}] + [{"type": "image"} for _ in range(num_images)]
        return self._template.render(messages=[{"role": "user", "content": content}], add_generation_prompt=False)
