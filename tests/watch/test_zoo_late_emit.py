"""When an engine reports its tokens must not change the verdict (`zoo.late_emit`): the same
padded engine (a proposer the watch cannot see, ragged drafts per row, holes, rows leaving) emits
each token when chosen, the prefill's token only with the first verify's, or every bonus only
with the next step's tokens. The watch reads an emission that starts with the token the newest
call fed as pending as an earlier call's bonus emitted late (`steps._late_bonus`); before, the
two late modes drew 5 and 51 false violations on a correct run (accounting, then positions and
KV from the misread steps). Correct runs: clean and equal to batch-1 greedy; a stale-KV bug:
found at its (step, sequence), whatever the timing. Several model families, so the repeats a
tiny model falls into (the same token over and over) are among the cases."""

from __future__ import annotations

import pytest
from tiny import make_pair
from zoo import late_emit, shapes

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]


@pytest.fixture(scope="module", params=["llama", "gpt_neox", "qwen3"])
def pair(request):
    return make_pair(request.param)


@pytest.fixture(scope="module")
def reference(pair):
    return shapes.reference(pair.target, PROMPTS, BUDGETS)


def watched(pair, emit: str, bug: str | None):
    with specviz.watch(pair.target, prompts=PROMPTS, name=f"late-{emit}") as w:
        outs, events = late_emit.generate(pair.target, pair.draft, PROMPTS, BUDGETS, bug=bug, w=w, emit=emit)
    return check_trace(w.trace), outs, events


@pytest.mark.parametrize("emit", late_emit.EMITS)
def test_a_correct_run_is_clean_whenever_it_emits(pair, reference, emit: str) -> None:
    report, outs, _ = watched(pair, emit, None)
    assert outs == reference
    assert report.verdict == "clean" and not report.violations, [
        (v.step, v.seq_id, v.message) for v in report.violations[:3]
    ]


@pytest.mark.parametrize("emit", late_emit.EMITS)
def test_stale_kv_is_found_at_its_step_whenever_it_emits(pair, emit: str) -> None:
    report, _, events = watched(pair, emit, "stale_kv")
    assert events, "the bug never fired"
    first = report.violations[0]
    assert (first.step, first.seq_id, first.invariant) == (*events[0], Invariant.KV)
