"""Run one zoo engine as an unmodified script under `specviz watch --` (in-process, as the command
runs it) and read back what it says: the trace, the engine's outputs and its bug locations
(`scripts/run_engine.py` prints `OUTS` and `EVENTS`)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from specviz.cli import main
from specviz.trace.io import load_trace
from specviz.trace.schema import Trace

SCRIPT = Path(__file__).parent / "scripts" / "run_engine.py"


def watch_script(
    out: Path,
    engine: str,
    prompts: list[list[int]],
    budgets: list[int],
    bug: str | None = None,
    options: dict[str, int] | None = None,
    script_args: list[str] | None = None,
    watch_args: list[str] | None = None,
) -> tuple[Trace, list[list[int]], list[tuple[int, ...]]]:
    """(trace, outputs, events) of `engine` run by `specviz watch --out out [watch_args] -- python
    run_engine.py engine ...` with `--set NAME=VALUE` per option."""
    argv = ["watch", "--out", str(out), *(watch_args or []), "--", "python", str(SCRIPT), engine, *(script_args or [])]
    argv += ["--prompts", json.dumps(prompts), "--budgets", ",".join(map(str, budgets))]
    argv += [arg for name, value in (options or {}).items() for arg in ("--set", f"{name}={value}")]
    argv += ["--bug", bug] if bug else []
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    said = dict(line.split(" ", 1) for line in printed.getvalue().splitlines() if line.startswith(("OUTS", "EVENTS")))
    return load_trace(out), json.loads(said["OUTS"]), [tuple(e) for e in json.loads(said["EVENTS"])]


def assert_command_read(
    trace: Trace, outs: list[list[int]], events: list[tuple[int, ...]], reference: list[list[int]], invariant=None
) -> None:
    """What the command must say of a zoo run: a correct one (`invariant` None) produced the
    reference and reads clean and exact; a bug never reads clean, and its first violation is
    the engine's first event (step, sequence) with `invariant`."""
    from specviz.analysis.check import check_trace

    report = check_trace(trace)
    first = report.first_violation
    if invariant is None:
        assert outs == reference
        assert report.verdict == "clean" and report.exact_match == 1.0, (report.unreadable, first)
        return
    assert events and report.verdict != "clean"
    assert (first.step, first.seq_id, first.invariant) == (*events[0][:2], invariant), report.violations[:3]
