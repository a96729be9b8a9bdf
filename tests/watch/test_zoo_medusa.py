"""Medusa-shaped drafting (`zoo.head.MedusaHeads`): ONE head call per step returns every draft
([B, heads, V] logits from a [B, 1, H] hidden state), unlike the EAGLE-like head that is called
once per draft. Through the API with the heads named (`drafter=`) and not, over a padded and a
packed target, and through the command: a correct run is clean and equal to batch-1 greedy; a
stale-KV bug is found at its (step, sequence); with the heads named, a head fed another row's
hidden state is found at its (step, sequence) as a head-input fault.

The watch once matched a verify row to whichever head row's LAST logits column equalled the row's
first draft: for Medusa heads that column is the last draft, so a correct run drew a false
head-input violation wherever another row's last draft happened to equal this row's first."""

from __future__ import annotations

import pytest
from tiny import make_pair
from zoo import head, shapes
from zoo.command import assert_command_read, watch_script

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(scope="module")
def heads(pair):
    return head.MedusaHeads(pair.target)


@pytest.fixture(scope="module")
def reference(pair):
    return shapes.reference(pair.target, PROMPTS, BUDGETS)


def watched(pair, heads, bug, named: bool, packed: int):
    extra = {"drafter": heads} if named else {}
    with specviz.watch(pair.target, prompts=PROMPTS, name="medusa", **extra) as w:
        outs, events = head.generate(pair.target, heads, PROMPTS, BUDGETS, bug=bug, w=w, packed=packed)
    return check_trace(w.trace), outs, events


@pytest.mark.parametrize("packed", [0, 1])
@pytest.mark.parametrize("named", [True, False])
def test_correct_medusa_run_is_clean_and_exact(pair, heads, reference, named: bool, packed: int) -> None:
    report, outs, _ = watched(pair, heads, None, named, packed)
    assert outs == reference
    assert report.verdict == "clean" and not report.violations, [v.message for v in report.violations[:3]]


@pytest.mark.parametrize("packed", [0, 1])
@pytest.mark.parametrize(
    ("bug", "invariant", "named"), [("stale_kv", Invariant.KV, False), ("head_row", Invariant.HEAD, True)]
)
def test_medusa_bugs_are_found_where_injected(pair, heads, bug, invariant, named: bool, packed: int) -> None:
    report, _, events = watched(pair, heads, bug, named, packed)
    first = report.violations[0]
    assert (first.step, first.seq_id, first.invariant) == (*events[0], invariant)


@pytest.mark.parametrize("bug", [None, "stale_kv"])
def test_medusa_through_the_command(tmp_path, reference, bug) -> None:
    trace, outs, events = watch_script(tmp_path / "medusa.trace.json", "head", PROMPTS, BUDGETS, bug, {"medusa": 1})
    report = check_trace(trace)
    if bug is None:
        assert outs == reference  # the command's own tiny target is make_pair's
        assert report.verdict == "clean" and not report.violations
    else:
        first = report.violations[0]
        assert (first.step, first.seq_id, first.invariant) == (*events[0], Invariant.KV)


# Prompts all of one length, the second leaving after step 0: the next call's last row (the fourth
# sequence, its draft rejected) is fed the token the second sequence's first draft also was, at
# the same context length. Greedy acceptance tells them apart (the second kept that draft, so its
# context grew by two); before it, the correct run was unreadable from step 1, and the stale-KV
# row (then read as the second sequence's prompt chunk) misplaced.
EQUAL = [[91, 86, 70, 6], [62, 34, 86, 9], [23, 17, 50, 63], [34, 51, 72, 16]]
EQUAL_BUDGETS = [6, 3, 6, 9]
EQUAL_BUGS = {"stale_kv": Invariant.KV, "positions": Invariant.POSITIONS}


@pytest.mark.parametrize("bug", [None, "stale_kv", "positions"])
@pytest.mark.parametrize("medusa", [0, 1])
def test_equal_prompt_lengths_through_the_command(tmp_path, pair, medusa: int, bug) -> None:
    out = tmp_path / "equal.trace.json"
    trace, outs, events = watch_script(out, "head", EQUAL, EQUAL_BUDGETS, bug, {"medusa": medusa})
    reference = shapes.reference(pair.target, EQUAL, EQUAL_BUDGETS)
    assert_command_read(trace, outs, events, reference, EQUAL_BUGS[bug] if bug else None)
