"""No import circle among specviz's modules: data flows one way (engine -> trace -> analysis ->
views -> app), and a module that imports one importing it back, even only for a type hint, has
lost that direction. Every import counts, a function's or a TYPE_CHECKING block's included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specviz"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _owner(name: str, modules: set[str]) -> str | None:
    """The module a dotted name lives in (`specviz.a.b.thing` -> `specviz.a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(path: Path, module: str, modules: set[str]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    owners = {_owner(name, modules) for name in names if name.startswith("specviz")}
    # A package's __init__ importing its own submodules is how it exports them, not a circle.
    return {o for o in owners if o and o != module and not o.startswith(module + ".")}


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: _imported(p, m, set(files)) for m, p in files.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (a path that comes back to its start), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            found = None if target in state else visit(target)
            if found:
                return found
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        found = None if module in state else visit(module)
        if found:
            return found
    return None


def test_the_finder_sees_a_circle_and_its_absence():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_specviz_has_no_import_circle():
    graph = import_graph()
    assert "specviz.engine.step" in graph and "specviz.engine.prefill" in graph["specviz.engine.step"]
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])
