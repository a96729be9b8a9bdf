"""A small, self-contained AST mutation-testing runner (docs/testing.md#mutation-testing).

For each target module it parses the source, lists the mutation sites (comparison flips, +/- and
* / / swaps, constant off-by-one, `and`/`or`, `min`/`max`, `argmax`/`argmin`, negation removed,
`True`/`False`, one statement replaced by `pass`), and for each mutant writes the mutated module
into a temporary copy of the repository and runs the given test files there with
`pytest -x -q`. A mutant is *killed* when the tests fail (or time out), *survived* when they pass.

The mutation sites are `tools/mutants.py`'s; this module runs them.

Speed: the parent process imports the heavy third-party libraries (torch, transformers, pytest)
once, then forks one child per mutant; the child imports `specviz` fresh from the temporary copy
(bytecode caching off, so a mutant never reads a stale .pyc) and runs pytest in-process.

    python -m tools.mutation                      # every default target with its fast tests
    python -m tools.mutation --target rules       # one default target
    python -m tools.mutation --target check       # check / finish / row_checks: the synthetic tests only
    python -m tools.mutation --module specviz/engine/rules.py --tests tests/engine/test_sampling.py
    python -m tools.mutation --target metrics --sample 20 --seed 1   # a random subset
    python -m tools.mutation --target sampling --list                # the mutants, no runs

Run it under `nice -n 10`. The exit status is 0 whatever the score; `--min-score` makes it fail
below a threshold. Mutants are numbered in a stable order, so `--only 3,17` re-runs survivors.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.mutants import Mutant, diff, list_mutants, mutated_source

ROOT = Path(__file__).resolve().parent.parent

_CHECK_TESTS = [
    "tests/analysis/test_check.py",
    "tests/analysis/test_check_endings.py",
    "tests/analysis/test_check_state.py",
    "tests/analysis/test_check_hand_sized.py",
    "tests/analysis/test_finish.py",
    "tests/analysis/test_row_checks.py",
]
_CHECK_SLOW = (
    "speed",
    "correct_runs",
    "each_fault",
    "cli_json",
    "reduced_precision",
    "kv_content",
    "a_model_the_kv",
    "closed_pipe",
)
_ZOO_PRODUCTION = "tests/watch/test_zoo_production.py"
_WATCH_RUNS = ["tests/watch/test_watch.py", "tests/watch/test_batch_map.py", _ZOO_PRODUCTION]
# name -> (module, fast test files that are meant to kill its mutants)
TARGETS: dict[str, tuple[str, list[str]]] = {
    "rules": ("specviz/engine/rules.py", ["tests/engine/test_rejection_rule.py"]),
    "sampling": (
        "specviz/engine/sampling.py",
        ["tests/engine/test_sampling_oracle.py", "tests/engine/test_rejection_rule.py"],
    ),
    "metrics": ("specviz/analysis/metrics.py", ["tests/analysis/test_metrics.py"]),
    "acceptance": ("specviz/analysis/acceptance.py", ["tests/analysis/test_metrics.py"]),
    "exactness": ("specviz/analysis/exactness.py", ["tests/analysis/test_metrics.py"]),
    "check": ("specviz/analysis/check.py", _CHECK_TESTS),
    "finish": ("specviz/analysis/finish.py", _CHECK_TESTS),
    "row_checks": ("specviz/analysis/row_checks.py", _CHECK_TESTS),
    # The watch: each module with the map's own cases first (quick to fail), then the
    # production-shaped engines that stand on it (tests/watch/test_zoo_production.py).
    "batchmap": (
        "specviz/watch/batchmap.py",
        ["tests/watch/test_batch_map_rules.py", "tests/watch/test_batch_map.py", _ZOO_PRODUCTION],
    ),
    "paged": ("specviz/watch/paged.py", ["tests/watch/test_paged_capture.py", _ZOO_PRODUCTION]),
    "headinput": (
        "specviz/watch/headinput.py",
        ["tests/watch/test_head_source.py", "tests/watch/test_head_input.py", _ZOO_PRODUCTION],
    ),
    # The readers every watched run goes through (API), and the command's row following.
    # (test_zoo: engines whose draft calls only the stop at the previous target call tells apart.)
    "calls": (
        "specviz/watch/calls.py",
        ["tests/watch/test_call_rows.py", "tests/watch/test_rules_calls.py", *_WATCH_RUNS, "tests/watch/test_zoo.py"],
    ),
    "steps": (
        "specviz/watch/steps.py",
        [
            "tests/watch/test_step_tokens.py",
            "tests/watch/test_watch_header.py",
            "tests/watch/test_head_source.py",
            *_WATCH_RUNS,
        ],
    ),
    # The path rules every verify row is read by (a chain is a tree), and the tree readings.
    "tree": (
        "specviz/watch/tree.py",
        [
            "tests/watch/test_step_tokens.py",
            "tests/watch/test_rules_credit.py",
            "tests/watch/test_rules_tree.py",
            "tests/watch/test_zoo_tree.py",
            *_WATCH_RUNS,
        ],
    ),
    "follow_match": (
        "specviz/watch/infer/match.py",
        [
            "tests/watch/test_rules_match.py",
            "tests/watch/test_rules_newcomers.py",
            "tests/watch/test_rules_follow.py",
            "tests/watch/test_rules_followed.py",
            "tests/watch/test_follow.py",
            "tests/watch/test_follow_weak.py",
            "tests/watch/test_zoo.py",
            _ZOO_PRODUCTION,
        ],
    ),
}
# Default pytest arguments of a target (`--pytest-args` overrides): the checker's test files
# without their tiny-model runs (minutes per surviving mutant); the synthetic tests stay.
TARGET_PYTEST_ARGS = {
    name: "-k '" + " and ".join(f"not {k}" for k in _CHECK_SLOW) + "'" for name in ("check", "finish", "row_checks")
}
# The production zoo through the API only (the command's runs read the same maps, at twice the cost).
# (follow_match keeps the command's runs: it is what they read rows with.)
TARGET_PYTEST_ARGS.update({name: "-k 'not command'" for name in ("batchmap", "headinput", "steps", "tree")})
TARGET_PYTEST_ARGS["calls"] = "-k 'not command and not cli'"
TARGET_PYTEST_ARGS["paged"] = "-k 'paged and not command'"  # its own cases (the file's name selects it whole)


@dataclass
class Result:
    module: str
    tests: list[str]
    mutants: list[Mutant] = field(default_factory=list)

    @property
    def killed(self) -> int:
        return sum(m.status in ("killed", "timeout") for m in self.mutants)

    @property
    def survived(self) -> list[Mutant]:
        return [m for m in self.mutants if m.status == "survived"]

    @property
    def score(self) -> float:
        run = [m for m in self.mutants if m.status != "pending"]
        return self.killed / len(run) if run else 0.0


def _copy_repo(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".ruff_cache", ".hypothesis", "build", "runs")
    for entry in ROOT.iterdir():
        if entry.name in (".git", "benchmarks", "docs", "traces", "build", "runs", "bench-out", "test-output"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=ignore)
        else:
            shutil.copy2(entry, dest / entry.name)
    for needed in ("docs", "traces"):  # some tests read documents or recorded traces
        if (ROOT / needed).exists():
            shutil.copytree(ROOT / needed, dest / needed, ignore=ignore)


def _log_path(workdir: Path) -> Path:
    """The last child's pytest output (inside the temporary copy, so it goes with it)."""
    return workdir / ".mutation-child.log"


def _run_tests(
    workdir: Path, tests: list[str], extra: list[str], timeout: float, *, write_bytecode: bool = False
) -> tuple[str, float]:
    """Fork; the child runs pytest in-process against `workdir`. ('killed' | 'survived' | 'timeout', s).

    The child's output goes to `_log_path(workdir)` (overwritten each run), so a failing baseline
    can say why. `write_bytecode` (the baseline run only): pytest caches its assertion-rewritten
    test modules, which every later mutant then reads instead of rewriting them (~1 s a mutant)."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        code = 3
        try:
            sys.dont_write_bytecode = not write_bytecode
            log = os.open(_log_path(workdir), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            signal.alarm(int(timeout))
            import pytest

            # -n 0: in this fork (pyproject asks for two xdist workers, which would import specviz anew)
            code = int(pytest.main(["-x", "-q", "-n", "0", "-p", "no:cacheprovider", *extra, *tests]))
            spec = sys.modules.get("specviz")
            if spec is not None and not str(getattr(spec, "__file__", "")).startswith(str(workdir)):
                code = 99  # imported the real tree, not the mutated copy: the run proves nothing
        finally:
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): take the child down too
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    seconds = time.monotonic() - start
    if os.WIFSIGNALED(status):
        return "timeout", seconds
    code = os.WEXITSTATUS(status)
    if code == 99:
        raise SystemExit("the tests imported specviz from outside the temporary copy; check PYTHONPATH")
    return ("survived" if code == 0 else "killed"), seconds


def run_target(
    module: str,
    tests: list[str],
    workdir: Path,
    *,
    extra: list[str],
    timeout: float,
    sample: int | None,
    seed: int,
    only: set[int] | None,
    function: str | None,
    listing: bool,
) -> Result:
    path = workdir / module
    original = (ROOT / module).read_text()
    baseline = ast.unparse(ast.parse(original)) + "\n"
    mutants = list_mutants(original)
    if function:
        mutants = [m for m in mutants if m.function == function or m.function.startswith(function + ".")]
    if only is not None:
        mutants = [m for m in mutants if m.number in only]
    if sample is not None and sample < len(mutants):
        mutants = sorted(random.Random(seed).sample(mutants, sample), key=lambda m: m.number)
    result = Result(module, tests, mutants)
    for m in mutants:
        m.diff = diff(baseline, mutated_source(original, m))
    if listing:
        return result
    try:
        path.write_text(baseline)  # the unmutated code as the runner writes it must pass
        status, seconds = _run_tests(workdir, tests, extra, timeout * 3, write_bytecode=True)
        if status != "survived":
            tail = "\n".join(_log_path(workdir).read_text(errors="replace").splitlines()[-40:])
            raise SystemExit(f"{tail}\n{module}: the tests fail on the unmutated module ({status}); fix that first")
        # Keep the tests' cached bytecode, never the package's: a mutant written within the same
        # second as the same size would otherwise be read from a stale .pyc.
        for cache in (workdir / "specviz").rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)
        print(f"{module}: {len(mutants)} mutants, tests {' '.join(tests)} (baseline {seconds:.1f}s)", flush=True)
        for m in mutants:
            path.write_text(mutated_source(original, m))
            m.status, m.seconds = _run_tests(workdir, tests, extra, timeout)
            mark = {"killed": ".", "timeout": "T", "survived": "S"}[m.status]
            print(mark, end="", flush=True)
        print(flush=True)
    finally:
        path.write_text(original)
    return result


def _report(results: list[Result]) -> str:
    lines = []
    for r in results:
        run = [m for m in r.mutants if m.status != "pending"]
        lines.append(f"{r.module}: {r.killed}/{len(run)} killed ({100 * r.score:.1f}%)  tests: {' '.join(r.tests)}")
        for m in r.survived:
            lines.append(f"  SURVIVED #{m.number} {m.function} line {m.line}: {m.description}")
            lines.extend("      " + d for d in m.diff.splitlines())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="a default target (repeatable)")
    ap.add_argument("--module", help="a module path relative to the repository root (with --tests)")
    ap.add_argument("--tests", nargs="+", help="test files (override the target's)")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, e.g. \"-k 'not slow'\"")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant before it counts as killed")
    ap.add_argument("--sample", type=int, help="run a random subset of this many mutants")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="comma-separated mutant numbers")
    ap.add_argument("--function", help="only mutants inside this function (or class)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their diffs; run nothing")
    ap.add_argument("--json", help="write the full results here")
    ap.add_argument("--min-score", type=float, help="exit 1 if a module scores below this (0..1)")
    args = ap.parse_args(argv)

    if args.module:
        if not args.tests:
            ap.error("--module needs --tests")
        jobs = [(args.module, args.tests, args.pytest_args)]
    else:
        names = args.target or list(TARGETS)
        jobs = [
            (TARGETS[n][0], args.tests or TARGETS[n][1], args.pytest_args or TARGET_PYTEST_ARGS.get(n, ""))
            for n in names
        ]
    only = {int(x) for x in args.only.split(",")} if args.only else None

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temporary copy is removed
    results = []
    with tempfile.TemporaryDirectory(prefix="specviz-mutation-") as tmp:
        workdir = Path(tmp)
        if not args.list:
            _copy_repo(workdir)
            # The children import specviz from the copy only.
            sys.dont_write_bytecode = True
            os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
            os.environ["PYTHONPATH"] = f"{workdir}{os.pathsep}{workdir / 'tests'}"
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            sys.path[:] = [
                p for p in sys.path if Path(p or ".").resolve() not in (ROOT, ROOT / "tests", ROOT / "tools")
            ]
            sys.path[:0] = [str(workdir), str(workdir / "tests")]
            os.chdir(workdir)
            for heavy in (
                "torch",
                "numpy",
                "pytest",
                "transformers",
                "transformers.generation.logits_process",
                "hypothesis",  # pytest's hypothesis plugin imports it at session end: ~2 s a mutant
            ):  # once, not per mutant
                try:
                    __import__(heavy)
                except ImportError:
                    pass
        for module, tests, pytest_args in jobs:
            results.append(
                run_target(
                    module,
                    tests,
                    workdir,
                    extra=shlex.split(pytest_args),
                    timeout=args.timeout,
                    sample=args.sample,
                    seed=args.seed,
                    only=only,
                    function=args.function,
                    listing=args.list,
                )
            )
    if args.list:
        for r in results:
            print(f"{r.module}: {len(r.mutants)} mutants")
            for m in r.mutants:
                print(f"  #{m.number} {m.function} line {m.line}: {m.description}")
        return 0
    print(_report(results))
    if args.json:
        data = [
            {"module": r.module, "tests": r.tests, "score": r.score, "mutants": [asdict(m) for m in r.mutants]}
            for r in results
        ]
        Path(args.json).write_text(json.dumps(data, indent=1))
    if args.min_score is not None and any(r.score < args.min_score for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
