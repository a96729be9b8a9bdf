"""Mutation sites: where a module's source can be mutated, and each mutant's source (`tools/mutation.py` runs them).

Comparison flips, +/- and * / / swaps, constant off-by-one, `and`/`or`, `min`/`max`,
`argmax`/`argmin`, negation removed, `True`/`False`, one statement replaced by `pass`. Mutants are
numbered in a stable order (the order of `_nodes`), so a survivor can be re-run by number.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

_CMP_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BIN_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitXor: ast.BitOr,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}
_NAME_SWAP = {"min": "max", "max": "min", "argmax": "argmin", "argmin": "argmax", "any": "all", "all": "any"}
_REMOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.If, ast.For, ast.Raise)


@dataclass
class Mutant:
    number: int
    node: int  # index of the mutated node in `_nodes(tree)` order
    kind: str
    function: str
    line: int
    description: str
    status: str = "pending"  # killed | survived | timeout | pending
    seconds: float = 0.0
    diff: str = ""


def _skipped_ids(tree: ast.AST) -> set[int]:
    """Nodes never mutated: docstrings, annotations, imports, `TypeVar`s and `...` bodies."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                mark(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                mark(arg.annotation)
            for arg in (node.args.vararg, node.args.kwarg):
                if arg is not None:
                    mark(arg.annotation)
        if isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        if isinstance(node, (ast.ImportFrom, ast.Import)):
            mark(node)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node.value.value is Ellipsis:
            mark(node)  # a Protocol's or stub's `...` body: `pass` instead is the same program
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TypeVar":
            mark(node)
    return skip


def _nodes(tree: ast.AST) -> list[tuple[ast.AST, str, ast.AST | None, str | None]]:
    """Every node in a stable order with its enclosing function, parent and parent field."""
    out: list[tuple[ast.AST, str, ast.AST | None, str | None]] = []

    def visit(node: ast.AST, scope: str, parent: ast.AST | None, fld: str | None) -> None:
        out.append((node, scope, parent, fld))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = node.name if scope == "<module>" else f"{scope}.{node.name}"
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        visit(item, scope, node, name)
            elif isinstance(value, ast.AST):
                visit(value, scope, node, name)

    visit(tree, "<module>", None, None)
    return out


def _variants(node: ast.AST, parent: ast.AST | None, fld: str | None) -> list[tuple[str, str]]:
    """(kind, description) of each mutation this node admits."""
    out: list[tuple[str, str]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP_SWAP:
                out.append((f"cmp:{i}", f"{type(op).__name__} -> {_CMP_SWAP[type(op)].__name__}"))
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BIN_SWAP:
        out.append(("binop", f"{type(node.op).__name__} -> {_BIN_SWAP[type(node.op)].__name__}"))
    elif isinstance(node, ast.BoolOp):
        out.append(("boolop", "and <-> or"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        out.append(("unary", f"drop {type(node.op).__name__}"))
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            out.append(("bool", f"{node.value} -> {not node.value}"))
        elif isinstance(node.value, (int, float)):
            out.append(("const+1", f"{node.value!r} -> {node.value + 1!r}"))
            if node.value != 0:
                out.append(("const-1", f"{node.value!r} -> {node.value - 1!r}"))
    elif isinstance(node, ast.Name) and node.id in _NAME_SWAP and isinstance(node.ctx, ast.Load):
        out.append(("name", f"{node.id} -> {_NAME_SWAP[node.id]}"))
    elif isinstance(node, ast.Attribute) and node.attr in _NAME_SWAP:
        out.append(("attr", f".{node.attr} -> .{_NAME_SWAP[node.attr]}"))
    elif isinstance(node, ast.keyword) and node.arg in ("min", "max"):
        out.append(("kwarg", f"{node.arg}= -> {_NAME_SWAP[node.arg]}="))
    if isinstance(node, _REMOVABLE) and fld in ("body", "orelse") and parent is not None:
        if not isinstance(parent, (ast.Module, ast.ClassDef)):  # module/class statements: definitions
            out.append(("remove", f"remove `{ast.unparse(node).splitlines()[0][:60]}`"))
    return out


def _apply(node: ast.AST, parent: ast.AST | None, fld: str | None, kind: str) -> None:
    if kind.startswith("cmp:"):
        i = int(kind[4:])
        node.ops[i] = _CMP_SWAP[type(node.ops[i])]()
    elif kind == "binop":
        node.op = _BIN_SWAP[type(node.op)]()
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "unary":
        replacement = node.operand
        for name, value in ast.iter_fields(parent):
            if value is node:
                setattr(parent, name, replacement)
            elif isinstance(value, list):
                value[:] = [replacement if v is node else v for v in value]
    elif kind == "bool":
        node.value = not node.value
    elif kind == "const+1":
        node.value = node.value + 1
    elif kind == "const-1":
        node.value = node.value - 1
    elif kind == "name":
        node.id = _NAME_SWAP[node.id]
    elif kind == "attr":
        node.attr = _NAME_SWAP[node.attr]
    elif kind == "kwarg":
        node.arg = _NAME_SWAP[node.arg]
    elif kind == "remove":
        body = getattr(parent, fld)
        body[body.index(node)] = ast.copy_location(ast.Pass(), node)
    else:
        raise ValueError(kind)


def list_mutants(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skip = _skipped_ids(tree)
    mutants = []
    for index, (node, scope, parent, fld) in enumerate(_nodes(tree)):
        if id(node) in skip:
            continue
        for kind, description in _variants(node, parent, fld):
            line = getattr(node, "lineno", 0)
            mutants.append(Mutant(len(mutants), index, kind, scope, line, description))
    return mutants


def mutated_source(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    node, _, parent, fld = _nodes(tree)[mutant.node]
    _apply(node, parent, fld, mutant.kind)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def diff(original: str, mutated: str) -> str:
    lines = difflib.unified_diff(original.splitlines(), mutated.splitlines(), lineterm="", n=0)
    return "\n".join(line for line in lines if not line.startswith(("---", "+++")))
