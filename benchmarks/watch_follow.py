"""How `specviz watch --` follows the rows of engines whose batch changes, on random prompts.

For each seed: 3 to 7 random prompts (1 to 8 tokens; the last, which `join` prefills alone, at
least 2), each zoo engine run once through the API (its trace must check clean with exact match
1.0, else the engine itself went wrong there: skipped) and once through the command. A run the
command followed to the end must check clean with exact match 1.0; one it stopped reading (rows
that fit several sequences) must have no violation. Prints one line per run and the totals.

    export PYTHONPATH=.:tests/watch:tests/support OMP_NUM_THREADS=1
    python benchmarks/watch_follow.py --seeds 12 30 --max-new 16

(tests/watch and tests/support on the path, as pytest's `pythonpath` puts them: the zoo imports as `zoo`.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import tempfile
from collections import Counter
from pathlib import Path

import test_zoo as zoo  # the zoo's own runners: API and command

from specviz.analysis.check import check_trace


def prompts_for(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    n = rng.randint(3, 7)
    prompts = [[rng.randint(3, 90) for _ in range(rng.randint(1, 8))] for _ in range(n - 1)]
    prompts.append([rng.randint(3, 90) for _ in range(rng.randint(2, 8))])
    if rng.random() < 0.3:
        prompts[1] = list(prompts[0])  # identical sequences
    return prompts


def one_run(pair, name: str) -> str:
    """ "skipped", "followed", "stopped" or "WRONG" (a violation or an inexact output on a correct run)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        api, _, _ = zoo.run_api(pair, name)
        if not (lambda r: r.verdict == "clean" and r.exact_match == 1.0)(check_trace(api)):
            return "skipped"
        trace = zoo.run_cli(Path(tempfile.mkdtemp()), name)
    report = check_trace(trace)
    if not trace.header.complete:
        return "stopped" if not report.violation_count else "WRONG"
    return "followed" if report.verdict == "clean" and report.exact_match == 1.0 else "WRONG"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs=2, default=(12, 30), help="first and last + 1")
    parser.add_argument("--max-new", type=int, default=16)
    parser.add_argument("--engines", default="compact,join,rejoin")
    args = parser.parse_args()
    zoo.MAX_NEW = args.max_new
    pair = zoo.make_pair("llama")
    totals: Counter[str] = Counter()
    for seed in range(*args.seeds):
        zoo.PROMPTS[:] = prompts_for(seed)
        for name in args.engines.split(","):
            outcome = one_run(pair, name)
            totals[outcome] += 1
            print(seed, name, len(zoo.PROMPTS), outcome, flush=True)
    print(dict(totals))


if __name__ == "__main__":
    main()
