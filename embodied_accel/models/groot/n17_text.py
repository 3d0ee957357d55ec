"""GR00T N1.7's prompt: the Qwen3-VL chat template and tokenizer, read from the backbone's model directory.

As the official processor: one user turn of every image (time-major, then camera) then the instruction, rendered
with ``add_generation_prompt=False``; the ``k``-th ``<|image_pad|>`` repeated ``grid_t * grid_h * grid_w /
merge_size**2`` times; rows left-padded with the pad token. :class:`N17Tokenizer` reads ``tokenizer.json`` (or
``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json``), the chat template and ``preprocessor_config.json``
from one directory. Needs ``tokenizers`` and ``jinja2`` (``pip install 'embodied-accel[groot]'``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .tokenizer import EXTRA, QwenTokenizer, TokenizerError

__all__ = ["IMAGE_PAD", "N17Tokenizer", "find_n17_tokenizer_dir"]

IMAGE_PAD, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def _has_vocab(directory: Path) -> bool:
    return (directory / "tokenizer.json").is_file() or all(
        (directory / name).is_file() for name in ("vocab.json", "merges.txt")
    )


def find_n17_tokenizer_dir(*candidates: Path | str | None) -> Path | None:
    """The first of ``candidates`` (or its ``tokenizer/`` / ``processor/``) holding a tokenizer and a chat template."""
    for candidate in candidates:
        if candidate is None:
            continue
        for directory in (Path(candidate), Path(candidate) / "tokenizer", Path(candidate) / "processor"):
            if _has_vocab(directory) and _template_text(directory) is not None:
                return directory
    return None


def _template_text(directory: Path) -> str | None:
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(encoding="utf-8")
    if (directory / "chat_template.json").is_file():
        template = _read_json(directory / "chat_template.json").get("chat_template")
        if isinstance(template, str):
            return template
    if (directory / "tokenizer_config.json").is_file():
        template = _read_json(directory / "tokenizer_config.json").get("chat_template")
        if isinstance(template, str):
            return template
    return None


class N17Tokenizer:
    """``encode(text) -> ids``, ``token_id(token)``, ``render(instruction, num_images)``, ``pad_id``; and the image
    processor's settings (:attr:`image_config`, the ``preprocessor_config.json`` dict, empty when absent)."""

    def __init__(self, directory: Path):
        try:
            import jinja2.ext
            import jinja2.sandbox
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ImportError(f"the GR00T N1.7 tokenizer needs the tokenizers and jinja2 packages: {EXTRA} "
                              f"({exc})") from None  # fmt: skip
        self.directory = directory
        self.source = str(directory)
        config_path = directory / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        if (directory / "tokenizer.json").is_file():
            try:
                self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
            except Exception as exc:  # the tokenizers library raises its own exception type
                raise TokenizerError(f"{directory / 'tokenizer.json'}: not a tokenizers file ({exc})") from None
            self._encode = lambda text: self._tokenizer.encode(text, add_special_tokens=True).ids
            self._token_id = self._tokenizer.token_to_id
        elif (directory / "vocab.json").is_file() and (directory / "chat_template.json").is_file():
            qwen = QwenTokenizer(directory)  # the byte-level BPE from vocab.json + merges.txt
            self._encode, self._token_id = qwen.encode, qwen.token_id
        else:
            raise TokenizerError(f"{directory}: no tokenizer.json, nor vocab.json + merges.txt + chat_template.json")
        template = _template_text(directory)
        if template is None:
            raise TokenizerError(
                f"{directory}: no chat template ({', '.join(TEMPLATE_FILES)} or tokenizer_config.json's chat_template)"
            )
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(template)
        self._special = {k: _content(v) for k, v in config.items() if k.endswith("_token") and _content(v) is not None}
        pad = self._special.get("pad_token", "<|endoftext|>")
        self.pad_id = self._token_id(pad)
        if self.pad_id is None:
            raise TokenizerError(f"{directory}: the pad token {pad!r} is not in the vocabulary")
        self.image_token = self._special.get("image_token", IMAGE_PAD)  # the Qwen3-VL processor's own override
        for token in (self.image_token, VISION_START, VISION_END):
            if self._token_id(token) is None:
                raise TokenizerError(f"{directory}: no {token} token (not a Qwen3-VL tokenizer?)")
        self.image_token_id = self._token_id(self.image_token)
        path = directory / "preprocessor_config.json"
        self.image_config = _read_json(path) if path.is_file() else {}

    @classmethod
    def from_dir(cls, path: str | Path) -> N17Tokenizer:
        directory = find_n17_tokenizer_dir(path)
        if directory is None:
            raise TokenizerError(f"tokenizer {path}: no tokenizer.json (or vocab.json + merges.txt) with a chat "
                                 "template there or under tokenizer/ (the Qwen3-VL backbone's directory)")  # fmt: skip
        return cls(directory)

    def token_id(self, token: str) -> int | None:
        return self._token_id(token)

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def render(self, instruction: str, num_images: int) -> str:
        """The chat template on one user turn: ``num_images`` images, then the instruction."""
        content = [{"type": "image", "image": None} for _ in range(num_images)]
        content.append({"type": "text", "text": instruction})
        return self._template.render(messages=[{"role": "user", "content": content}], add_generation_prompt=False,
                                     tools=None, documents=None, **self._special)  # fmt: skip

    def prompt_ids(self, instruction: str, image_tokens: Sequence[int]) -> list[int]:
        """Token ids of the whole prompt, the ``k``-th image pad expanded to ``image_tokens[k]`` copies."""
        text = self.render(instruction, len(image_tokens))
        pieces = text.split(self.image_token)
        if len(pieces) != len(image_tokens) + 1:
            raise TokenizerError(f"{self.directory}: the chat template wrote {len(pieces) - 1} {self.image_token} for "
                                 f"{len(image_tokens)} images")  # fmt: skip
        out = pieces[0]
        for count, piece in zip(image_tokens, pieces[1:], strict=True):
            out += self.image_token * count + piece
        return self.encode(out)


def _content(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str):
    raise TokenizerError(f"chat template: {message}")
