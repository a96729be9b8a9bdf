"""Every `module.name` that specviz and the app read off a module they import exists.

A name a refactor renamed or mistyped in a handler only fails when that handler runs (a key press
in a browser: `share.parsepick` did, once); this walks every module's source instead. Imported
modules are those bound by `import a.b as m` or `from a import m` where `a.m` is a module.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.joinpath("specviz").rglob("*.py"), ROOT / "app.py"])
OPTIONAL = ("vllm", "playwright")  # imported only where they are installed (their own venvs)


def _module(name: str) -> types.ModuleType | None:
    try:
        found = importlib.import_module(name)
    except ImportError:
        return None
    return found if isinstance(found, types.ModuleType) else None


def _bound_modules(tree: ast.Module) -> dict[str, str]:
    """Local name -> module name, for the module-level and function-level imports of a file."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return {local: name for local, name in bound.items() if name.startswith(("specviz", "app"))}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_attribute_read_off_an_imported_module_exists(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = {local: m for local, name in _bound_modules(tree).items() if (m := _module(name)) is not None}
    missing = sorted(
        f"{node.value.id}.{node.attr} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and not isinstance(node.ctx, ast.Store)
        and not hasattr(modules[node.value.id], node.attr)
    )
    assert not missing, missing
