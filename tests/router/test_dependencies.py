"""router/ imports neither gateway nor backends (beyond its wire types), and the request path
never imports the training package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROUTER = Path(__file__).resolve().parents[2] / "router"
MODULES = sorted(ROUTER.rglob("*.py"))


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROUTER)))
def test_dependency_direction(path: Path) -> None:
    for name in imported(path):
        assert not name.startswith("gateway"), name
        assert not name.startswith("backends") or name == "backends.types", name
        if "training" not in path.parts:
            assert not name.startswith("router.training"), name
