"""An MTP-like head called INSIDE the target's forward (`zoo.mtp`: a hook on the final norm runs it on
every query slot before the LM head runs), named to the watch (`drafter=target.mtp`). Its head call
is nested in a target call whose hidden states are not kept yet when the head is fed them: the watch
once matched it against the calls before only, so every drafting row read "unreadable" and a head
fed another row's hidden state went unseen. A correct run is clean and equal to batch-1 greedy (the
head in fp32, and in fp16 fed the states cast to it); a head fed rotated rows, or the call before's
states, is found at its (step, sequence) as a head-input fault."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from tiny import make_pair
from zoo import mtp, shapes

import specviz
from specviz.analysis.check import check_trace
from specviz.cli import main
from specviz.trace.invariants import Invariant
from specviz.trace.io import load_trace

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]
SCRIPT = Path(__file__).parent / "zoo" / "scripts" / "run_engine.py"


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(scope="module")
def reference(pair):
    return shapes.reference(pair.target, PROMPTS, BUDGETS)


def watched(pair, bug, dtype):
    head = mtp.attach(pair.target, dtype)
    with specviz.watch(pair.target, prompts=PROMPTS, name="mtp", drafter=head) as w:
        outs, events = mtp.generate(pair.target, PROMPTS, BUDGETS, bug=bug, w=w, dtype=dtype)
    return w.trace, outs, events


def head_sources(trace) -> list:
    return [row.head_source for step in trace.steps for row in step.rows if row.draft_tokens]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_correct_in_forward_head_is_clean_and_read(pair, reference, dtype) -> None:
    trace, outs, _ = watched(pair, None, dtype)
    report = check_trace(trace)
    assert outs == reference
    assert report.verdict == "clean" and not report.violations, [v.message for v in report.violations[:3]]
    sources = head_sources(trace)
    # Read, not skipped: every drafting row but those of a head batch larger than the verify's
    # (a row dropped between them; which head row served is then ambiguous) names its source.
    assert sum(s is not None for s in sources) >= len(sources) - 2 and len(sources) > 20


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bug", ["head_row", "head_stale"])
def test_in_forward_head_bugs_are_found_where_injected(pair, reference, bug, dtype) -> None:
    trace, outs, events = watched(pair, bug, dtype)
    report = check_trace(trace)
    assert outs == reference  # the target verifies the drafts: only the head's input is wrong
    first = report.violations[0]
    assert (first.step, first.seq_id, first.invariant) == (*events[0], Invariant.HEAD)


@pytest.mark.parametrize(("bug", "half"), [(None, 0), ("head_row", 0), ("head_row", 1)])
def test_in_forward_head_through_the_command(tmp_path, bug, half: int) -> None:
    """`--drafter MTPHead` names a module INSIDE the target: it is the head because it returns the
    target's logits (a layer of that name would not); a correct run is clean, a rotated head input
    is found at its (step, sequence)."""
    out = tmp_path / "mtp.trace.json"
    argv = ["watch", "--out", str(out), "--drafter", "MTPHead", "--", "python", str(SCRIPT), "mtp"]
    argv += ["--prompts", json.dumps(PROMPTS), "--budgets", ",".join(map(str, BUDGETS)), "--set", f"half={half}"]
    argv += ["--bug", bug] if bug else []
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    said = dict(line.split(" ", 1) for line in printed.getvalue().splitlines() if line.startswith(("OUTS", "EVENTS")))
    trace = load_trace(out)
    report = check_trace(trace)
    assert trace.header.proposer == "head"
    if bug is None:
        assert report.verdict == "clean" and not report.violations, [v.message for v in report.violations[:3]]
        assert sum(s is not None for s in head_sources(trace)) > 20
    else:
        first = report.violations[0]
        assert (first.step, first.seq_id, first.invariant) == (*json.loads(said["EVENTS"])[0], Invariant.HEAD)
