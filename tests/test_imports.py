"""The direction of imports between rpr_mt's packages: text at the bottom; data -> model -> train, model -> decode,
export beside decode.

Every module under rpr_mt/ is parsed (not imported), function-level imports included: a deferred import is still a
dependency. The text package imports no other rpr_mt module, decoding (an exported model's too) pulls in neither the
trainer nor the exporter, the model does not know who uses it, and no two modules import each other, directly or
through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rpr_mt"

# (importing package, packages it must never import)
FORBIDDEN = [
    ("rpr_mt.decode", ("rpr_mt.train", "rpr_mt.export", "rpr_mt.experiments")),
    ("rpr_mt.export", ("rpr_mt.train", "rpr_mt.experiments")),
    ("rpr_mt.model", ("rpr_mt.train", "rpr_mt.decode", "rpr_mt.export", "rpr_mt.experiments")),
    ("rpr_mt.data", ("rpr_mt.model", "rpr_mt.train", "rpr_mt.decode", "rpr_mt.export", "rpr_mt.experiments")),
    ("rpr_mt.checkpoint_files", ("rpr_mt.train", "rpr_mt.decode", "rpr_mt.export", "rpr_mt.experiments")),
    ("rpr_mt.device", ("rpr_mt.model", "rpr_mt.train", "rpr_mt.decode", "rpr_mt.export", "rpr_mt.experiments")),
]


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = module_names()


def imports_of(name: str, path: Path) -> set[str]:
    """The rpr_mt modules that ``name`` imports anywhere in its file (``from pkg import submodule`` counts as the
    submodule; a package's own parents are not counted: importing a submodule runs them, but that is no cycle)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_parser_sees_function_level_imports():
    """The rules below mean nothing if deferred imports went unseen: the trainer's dev BLEU decodes through a
    function-level import."""
    assert "rpr_mt.decode.translate" in GRAPH["rpr_mt.train.validation"]
    assert "rpr_mt.text.multi30k" in GRAPH["rpr_mt.decode.ctranslate2"]  # imported inside a method
    assert len(MODULES) > 50


def _edges(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{name} imports {target}" for name, targets in GRAPH.items() if within(name, package)
                  for target in targets if any(within(target, f) for f in forbidden))


@pytest.mark.parametrize("package, forbidden", FORBIDDEN, ids=[p for p, _ in FORBIDDEN])
def test_packages_import_only_downwards(package, forbidden):
    wrong = _edges(package, forbidden)
    assert not wrong, "; ".join(wrong)


# Modules below everything that reads them: the declarations of the position schemes (read by the config) and the
# exported model's file layout (read by decode and checkpoint I/O) import no rpr_mt module but these.
BOTTOM = {"rpr_mt.model.positions.schemes": set(), "rpr_mt.layouts": {"rpr_mt.errors"}}


@pytest.mark.parametrize("module", sorted(BOTTOM))
def test_bottom_modules_import_nothing_above_them(module):
    assert GRAPH[module] <= BOTTOM[module], sorted(GRAPH[module] - BOTTOM[module])


def test_the_text_package_imports_no_other_rpr_mt_module():
    """rpr_mt.text sits below everything (decode, evaluate and data use it): an import of any other rpr_mt module,
    at module or function level, would tie plain text handling to the rest of the package."""
    assert any(within(name, "rpr_mt.text") for name in MODULES)
    wrong = sorted(f"{name} imports {target}" for name, targets in GRAPH.items() if within(name, "rpr_mt.text")
                   for target in targets if not within(target, "rpr_mt.text"))
    assert not wrong, "; ".join(wrong)


def test_evaluate_only_scores():
    """rpr_mt.evaluate holds the metrics: it takes text rules from rpr_mt.text and decodes nothing itself."""
    assert not any(within(target, "rpr_mt.decode") for target in GRAPH["rpr_mt.evaluate"])
    assert all(target == "rpr_mt.errors" or within(target, "rpr_mt.text") for target in GRAPH["rpr_mt.evaluate"])


def test_no_import_cycles():
    """Tarjan's strongly connected components: any component of two or more modules is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
