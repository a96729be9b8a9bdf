"""No module reaches its imports by editing `sys.path`: tools run as `python -m tools.X`, test
helpers are on pytest's `pythonpath`, servers get the checkout through `PYTHONPATH`. Two edits
are the point of their code and stay, each for the reason given."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    # `specviz watch -- python script.py` runs the script in-process as Python would: its folder
    # first on the path while it runs, restored after.
    "specviz/watch/cli.py": "runs a user's script as `python script.py` would",
    # A forked child imports specviz from a mutated copy of the repository, not from this one.
    "tools/mutation.py": "each forked mutant imports the mutated copy",
}


def edits_sys_path(tree: ast.AST) -> bool:
    """Any `sys.path` method call, assignment, item or slice assignment."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "path" and ast.unparse(owner) == "sys.path":
                return True
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any("sys.path" in ast.unparse(t) for t in targets):
                return True
    return False


def python_files() -> list[Path]:
    folders = ("specviz", "tools", "tests", "benchmarks")
    return [p for folder in folders for p in (ROOT / folder).rglob("*.py") if "assets" not in p.parts]


def test_no_module_edits_sys_path() -> None:
    found = [
        str(path.relative_to(ROOT))
        for path in python_files()
        if edits_sys_path(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert sorted(set(found) - set(ALLOWED)) == [], "import through a package path or PYTHONPATH instead"
    assert sorted(found) == sorted(ALLOWED), "an allowed edit is gone: drop it from ALLOWED"


def test_the_rule_sees_each_form() -> None:
    for edit in ("sys.path.insert(0, 'x')", "sys.path[:0] = ['x']", "sys.path[:] = []", "sys.path = []",
                 "sys.path.append('x')", "sys.path += ['x']"):  # fmt: skip
        assert edits_sys_path(ast.parse(edit)), edit
    assert not edits_sys_path(ast.parse("saved = list(sys.path)\nos.path.join('a', 'b')"))
