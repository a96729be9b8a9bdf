"""Count the watch's inference rules: the branches (`if`/`elif` statements and conditional
expressions) in the modules that read who is where from the captured calls (issue 32's measure).

    python tools/count_rules.py                      # the default modules (below)
    python tools/count_rules.py specviz/watch/paged.py --rev HEAD~3

Each `if` and each `elif` is one ast.If node (an `elif` is an If in its parent's `orelse`); each
`x if c else y` is one ast.IfExp. Comprehension filters (`for x in y if c`) are not counted: they
select, they do not decide between readings. `--rev` counts the files as that git revision held
them (a file it did not have counts 0), so a change can be measured before and after.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

DEFAULT = ["specviz/watch/calls.py", "specviz/watch/steps.py", "specviz/watch/hooks.py", "specviz/watch/follow*.py"]


def count(source: str) -> tuple[int, int]:
    """(if/elif statements, conditional expressions) in one module's source."""
    nodes = list(ast.walk(ast.parse(source)))
    return sum(isinstance(n, ast.If) for n in nodes), sum(isinstance(n, ast.IfExp) for n in nodes)


def sources(patterns: list[str], rev: str | None) -> dict[str, str]:
    """Path -> source, from the working tree or from git revision `rev`."""
    if rev is None:
        paths = sorted({str(p) for pattern in patterns for p in Path().glob(pattern)})
        return {p: Path(p).read_text(encoding="utf-8") for p in paths}
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], capture_output=True, text=True, check=True)
    paths = sorted({p for p in listed.stdout.split() for pattern in patterns if Path(p).match(pattern)})
    return {
        p: subprocess.run(["git", "show", f"{rev}:{p}"], capture_output=True, text=True, check=True).stdout
        for p in paths
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT, help="files or globs (default: the watch's readers)")
    parser.add_argument("--rev", help="count the files as this git revision held them")
    args = parser.parse_args(argv)
    found = sources(args.paths, args.rev)
    if not found:
        print("no file matches " + " ".join(args.paths), file=sys.stderr)
        return 1
    total_if = total_exp = 0
    for path, source in found.items():
        ifs, exps = count(source)
        total_if, total_exp = total_if + ifs, total_exp + exps
        print(f"{path:40} {ifs:4} if/elif {exps:4} conditional expressions")
    print(f"{'total':40} {total_if:4} if/elif {total_exp:4} conditional expressions = {total_if + total_exp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
