"""Function sizes: a function a newcomer reads in one screen. Every function and method under the packages in
``CHECKED`` (nested ones included, each counted with what it contains) is at most ``MAX_LINES`` lines long, and every
other one in rpr_mt/ at most ``PACKAGE_MAX_LINES``, from its ``def`` (decorators not counted) to its last line,
docstring and comments included; rpr_mt/model/kernels/ (Triton and C-launch code, whose kernels are long by nature)
is left out. Parsed, not imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rpr_mt"
MAX_LINES = 80
CHECKED = ["train"]  # packages under rpr_mt/ whose functions are held to MAX_LINES
PACKAGE_MAX_LINES = 100
EXEMPT = PACKAGE / "model" / "kernels"


def function_sizes(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of every function and method in ``path``."""
    sizes = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                sizes.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "")
    return sizes


def test_the_measure_counts_a_function_from_def_to_its_last_line(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("class A:\n    @staticmethod\n    def f():\n        def g():\n            pass\n\n"
                      "        return g\n\n\nasync def h(): return 1\n")
    assert function_sizes(source) == [("A.f", 3, 5), ("A.f.g", 4, 2), ("h", 10, 1)]


@pytest.mark.parametrize("package", CHECKED)
def test_no_function_is_longer_than_a_screen(package):
    paths = sorted((PACKAGE / package).rglob("*.py"))
    assert paths
    long = [f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({size} lines)"
            for path in paths for name, line, size in function_sizes(path) if size > MAX_LINES]
    assert not long, f"over {MAX_LINES} lines: " + "; ".join(long)


def test_no_function_in_the_package_is_longer_than_a_long_screen():
    paths = [path for path in sorted(PACKAGE.rglob("*.py")) if EXEMPT not in path.parents]
    long = [f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({size} lines)"
            for path in paths for name, line, size in function_sizes(path) if size > PACKAGE_MAX_LINES]
    assert not long, f"over {PACKAGE_MAX_LINES} lines: " + "; ".join(long)
