"""The optional extras a command needs, checked together before it does any work.

Each extra of ``pyproject.toml`` that a command imports lazily is listed here by the modules it provides (module →
pip package). :func:`require_extras` imports them all first and names every missing extra in one line
(``pip install 'embodied-accel[shape,texture]'``), so a user installs once instead of meeting one extra after
another, each after minutes of work.
"""

from __future__ import annotations

import importlib

#: The modules each extra provides (import name -> pip package), as ``pyproject.toml`` declares them.
EXTRA_MODULES: dict[str, dict[str, str]] = {
    "shape": {"PIL": "pillow", "cv2": "opencv-python-headless", "yaml": "pyyaml"},
    "texture": {"xatlas": "xatlas", "cv2": "opencv-python-headless", "PIL": "pillow",
                "fast_simplification": "fast-simplification"},  # fmt: skip
    "serve": {"websockets": "websockets", "msgpack": "msgpack"},
}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_extras(*extras: str) -> dict[str, list[str]]:
    """The extras of ``extras`` with a package missing, each with its missing pip packages (empty: all present)."""
    missing: dict[str, list[str]] = {}
    for extra in extras:
        packages = [package for module, package in EXTRA_MODULES[extra].items() if not _importable(module)]
        if packages:
            missing[extra] = packages
    return missing


def require_extras(command: str, *extras: str) -> None:
    """Raise ``ImportError`` naming every missing extra of ``extras`` and its packages, in one line."""
    missing = missing_extras(*extras)
    if missing:
        packages = ", ".join(dict.fromkeys(p for names in missing.values() for p in names))
        raise ImportError(f"{command} needs {packages} (not installed): "
                          f"pip install 'embodied-accel[{','.join(missing)}]'")  # fmt: skip


__all__ = ["EXTRA_MODULES", "missing_extras", "require_extras"]
