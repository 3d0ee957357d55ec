"""Errors every model family raises for bad user input (they name the field or file and what was expected)."""

from __future__ import annotations


class ObservationError(ValueError):
    """A malformed observation: the message names the field and what was expected."""


class CheckpointError(ValueError):
    """A checkpoint that does not match the model: wrong family, missing/unexpected/mis-shaped tensors, a damaged
    file."""


#: How many UTF-8 bytes of instruction text may stand behind each token a model reads. A text instruction longer
#: than ``max tokens x`` this is refused before it is tokenized: tokenizing costs time in proportion to the text, so
#: a 15 MB prompt would otherwise hold the model for seconds only to be refused for its token count afterwards.
#: Real instructions average a few bytes per token; 64 leaves room for any tokenizer's longest pieces.
MAX_PROMPT_BYTES_PER_TOKEN = 64


def check_prompt_size(text: str, max_tokens: int, field: str) -> None:
    """Refuse ``text`` (an instruction the model reads as at most ``max_tokens`` tokens) when it is longer than
    :data:`MAX_PROMPT_BYTES_PER_TOKEN` bytes per token; cheap, so call it before tokenizing."""
    limit = max_tokens * MAX_PROMPT_BYTES_PER_TOKEN
    size = len(text) if len(text) > limit else len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ObservationError(
            f"{field}: the instruction is {size} {'characters' if len(text) > limit else 'bytes'} long; the model "
            f"reads at most {max_tokens} tokens, so at most {limit} bytes are accepted ({MAX_PROMPT_BYTES_PER_TOKEN} "
            "per token), checked before tokenizing"
        )


__all__ = ["MAX_PROMPT_BYTES_PER_TOKEN", "CheckpointError", "ObservationError", "check_prompt_size"]
