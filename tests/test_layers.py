"""The package's layers (docs/architecture.md): every import, at module level or inside a function, goes to the same
layer or one below, and no module reaches itself through its imports."""

from __future__ import annotations

import ast
from pathlib import Path

import embodied_accel

PACKAGE = Path(embodied_accel.__file__).resolve().parent

#: Bottom to top, as docs/architecture.md draws them. Packages of one layer may import each other (no circle).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("platform", "errors", "argtypes", "plans", "extras", "progress", "checkpoints", "__version__"),
    ("ops",),
    ("nn",),
    ("data", "geometry"),
    ("models",),
    ("cache", "parallel", "quant"),
    ("runtime",),
    ("policies", "pipelines", "deploy"),
    ("families", "load_policy"),
    ("bench", "serve", "train", "eval", "export"),
    ("cli", "__init__"),
)
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = ("embodied_accel", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> set[str]:
    """Every ``embodied_accel`` name ``path`` imports (``from . import x`` as ``package.x``), anywhere in it."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in names if name == "embodied_accel" or name.startswith("embodied_accel.")}


def layer_key(name: str) -> str:
    """The entry of :data:`LAYERS` a module or an imported name belongs to."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str:
    """The module an imported name lives in (``embodied_accel.ops.reference`` or the package of a name)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def test_every_package_has_a_layer():
    unplaced = {layer_key(name) for name in MODULES} - set(LAYER_OF)
    assert not unplaced, f"packages missing from LAYERS: {sorted(unplaced)}"


def test_no_import_goes_up_a_layer():
    upward = []
    for name, path in MODULES.items():
        level = LAYER_OF[layer_key(name)]
        for target in imported_names(path):
            if LAYER_OF[layer_key(target)] > level:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports up a layer:\n" + "\n".join(upward)


def test_no_import_circle():
    graph = {name: {resolve(t) for t in imported_names(path)} - {name} for name, path in MODULES.items()}
    circles, done = [], set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append(" -> ".join([*trail[trail.index(name) :], name]))
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_walker_sees_relative_and_function_level_imports():
    """The walker finds the imports the checks rely on: relative ones, and those inside a function."""
    path = PACKAGE / "models" / "vggt" / "plans.py"
    assert "embodied_accel.plans.QuantPlan" in imported_names(path)
    assert LAYER_OF[layer_key("embodied_accel.plans.QuantPlan")] < LAYER_OF[layer_key(module_name(path))]
    runtime = imported_names(PACKAGE / "runtime" / "__init__.py")
    assert "embodied_accel.runtime.torchair.torchair_call" in runtime  # imported inside capture_call
