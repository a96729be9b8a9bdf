"""Count the decisions a package makes (issue 41's measure of the watch):

- `if` and `elif` statements (an `elif` is an ast.If in its parent's `orelse`);
- conditional expressions (`x if c else y`);
- comprehension filters (`for x in y if c`: each `if` clause is one);
- `and`/`or` operands past the first (`a and b or c` decides twice).

    python tools/count_rules.py                              # specviz/watch, vllm/ included
    python tools/count_rules.py specviz/watch --exclude specviz/watch/vllm --by-file
    python tools/count_rules.py specviz/watch --rev HEAD~3   # as that git revision held it

A path is a folder (every .py file under it) or a glob of files. `--rev` counts the files as that
revision held them, so a change can be measured before and after. The counts agree with any
counter that walks the same ast nodes; lines are the files' lines, blank and comment lines included.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

KINDS = ("if/elif", "ifexp", "filters", "and/or")


def count(source: str) -> dict[str, int]:
    """Decisions of each kind in one module's source."""
    found = dict.fromkeys(KINDS, 0)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If):
            found["if/elif"] += 1
        elif isinstance(node, ast.IfExp):
            found["ifexp"] += 1
        elif isinstance(node, ast.comprehension):
            found["filters"] += len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            found["and/or"] += len(node.values) - 1
    return found


def _selected(path: str, patterns: list[str], excluded: list[str]) -> bool:
    inside = any(path == p or path.startswith(p.rstrip("/") + "/") or Path(path).match(p) for p in patterns)
    return path.endswith(".py") and inside and not any(path.startswith(x.rstrip("/") + "/") for x in excluded)


def sources(patterns: list[str], excluded: list[str], rev: str | None) -> dict[str, str]:
    """Path -> source of every selected .py file, from the working tree or from git revision `rev`."""
    if rev is None:
        paths = {str(f) for p in patterns for f in (Path(p).rglob("*.py") if Path(p).is_dir() else Path().glob(p))}
        return {p: Path(p).read_text(encoding="utf-8") for p in sorted(paths) if _selected(p, patterns, excluded)}
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], capture_output=True, text=True, check=True)
    paths = sorted(p for p in listed.stdout.split() if _selected(p, patterns, excluded))
    return {
        p: subprocess.run(["git", "show", f"{rev}:{p}"], capture_output=True, text=True, check=True).stdout
        for p in paths
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=["specviz/watch"], help="folders or globs (default: specviz/watch)")
    parser.add_argument("--exclude", action="append", default=[], help="a folder left out (repeatable)")
    parser.add_argument("--by-file", action="store_true", help="one line per file before the total")
    parser.add_argument("--rev", help="count the files as this git revision held them")
    args = parser.parse_args(argv)
    found = sources(args.paths, args.exclude, args.rev)
    if not found:
        print("no .py file matches " + " ".join(args.paths), file=sys.stderr)
        return 1
    total, lines = dict.fromkeys(KINDS, 0), 0
    for path, source in found.items():
        counted = count(source)
        lines += len(source.splitlines())
        for kind in KINDS:
            total[kind] += counted[kind]
        if args.by_file:
            print(f"{sum(counted.values()):5} {len(source.splitlines()):5} {path}")
    kinds = " ".join(f"{kind} {total[kind]}" for kind in KINDS)
    print(f"files {len(found)} lines {lines} {kinds} decisions {sum(total.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
