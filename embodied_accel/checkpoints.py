"""What a checkpoint directory says about itself, read without loading anything (family recognition)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_config(directory: str | Path) -> dict[str, Any] | None:
    """``directory/config.json`` as a dict, or None when it is missing, unreadable or not an object (the family's
    own loader reports what is wrong with it)."""
    try:
        data = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
