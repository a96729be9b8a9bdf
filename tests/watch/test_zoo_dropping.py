"""The dropping engine (`zoo/dropping.py`: a left-padded batch over one DynamicCache, drafts from a
per-row proposer, ragged drafts, holes, finished rows dropped with `batch_select_indices`),
through the command (`specviz watch -- python zoo/scripts/run_engine.py dropping ...`, in-process)
and the API (`w.rows`, the truth of who is where).

Once rows have left, the tiny models repeat tokens, so a row's token chain fits several
sequences; the command tells them apart by what the call says (the position fed to each row's
pending token, its mask's history), never by a guess. The truth is independent of specviz:
the correct engine equals batch-1 greedy decoding (`shapes.reference`), and each injected bug is
where the engine says it fed it (`events`). Before the command read that evidence, OPT's correct
run here was unreadable and its stale-KV run unreadable at the bug's step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import make_pair
from zoo import dropping, shapes
from zoo.command import watch_script

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]  # rows finish, and leave the batch, at different steps
INVARIANT = {"stale": Invariant.KV, "positions": Invariant.POSITIONS}

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _command(tmp: Path, family: str, bug: str | None):
    out = tmp / f"dropping-{family}-{bug}.trace.json"
    return watch_script(out, "dropping", PROMPTS, BUDGETS, bug, script_args=["--family", family])


@pytest.mark.parametrize(
    ("family", "bug"),
    [("opt", None), ("opt", "stale"), ("qwen3", None), ("qwen3", "positions"), ("gpt_neox", "stale")],
)
def test_command_reads_dropped_rows(tmp_path: Path, family: str, bug: str | None) -> None:
    """Correct: clean, exact, read to the end. Bug: its first violation at the engine's (step,
    sequence) with the invariant it breaks. Never a wrong output called clean."""
    trace, outs, events = _command(tmp_path, family, bug)
    report = check_trace(trace)
    expected = shapes.reference(make_pair(family).target, PROMPTS, BUDGETS, eos=1)
    v = report.first_violation
    if bug is None:
        assert outs == expected
        assert report.verdict == "clean" and report.exact_match == 1.0, (report.verdict, v, report.unreadable)
        assert report.unreadable is None
        return
    assert events, "the bug did not fire"
    assert report.verdict != "clean"
    seq_id = {tuple(s.prompt_ids): s.seq_id for s in trace.sequences}[tuple(PROMPTS[events[0][1]])]
    assert v is not None and (v.step, v.seq_id, v.invariant) == (events[0][0], seq_id, INVARIANT[bug]), (
        report.verdict,
        report.violations[:3],
        report.unreadable,
    )


def test_api_with_declared_rows_agrees() -> None:
    """The same engine through the API, rows declared: the oracle for the command's reading. The
    correct run equals batch-1 greedy and checks clean; the stale row is flagged at its step."""
    pair = make_pair("opt")
    expected = shapes.reference(pair.target, PROMPTS, BUDGETS, eos=1)
    for bug in (None, "stale"):
        with specviz.watch(pair.target, prompts=PROMPTS, name=f"dropping-{bug}") as w:
            outs, events = dropping.generate(pair.target, pair.draft, PROMPTS, BUDGETS, bug=bug, w=w)
        report = check_trace(w.trace)
        v = report.first_violation
        if bug is None:
            assert outs == expected and report.verdict == "clean", (report.verdict, v)
        else:
            assert events, "the bug did not fire"
            assert v is not None and (v.step, v.seq_id, v.invariant) == (*events[0], Invariant.KV), report.violations
