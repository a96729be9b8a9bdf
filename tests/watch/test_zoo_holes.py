"""A batch whose caches never move a slot (`zoo/holes.py`): rejected drafts stay in both caches as
holes the 2-D mask hides, positions count each row's own tokens, the draft keeps its own cache
(prefilled after the target, fed one token per call, ragged when a row accepted every draft), and
finished rows keep computing, or (`drop`) leave the batch and both caches. Written apart from the
watch's own engines; truth is batch-1 greedy decoding of the target without hooks
(`shapes.reference`). Through the API (emits only, rows not declared) and through `specviz watch
--`, prompt lengths mixed and all equal: each correct run reads clean and exact; each bug is first
located at the (step, sequence) the engine names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import make_pair
from zoo import holes, shapes
from zoo.command import assert_command_read, watch_script

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant

PROMPTS = {
    "mixed": [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21, 22, 23, 24]],
    "equal": [[5, 6, 7, 8], [11, 12, 13, 14], [15, 16, 17, 18]],
}
BUDGETS = {"mixed": [10, 6, 12, 9], "equal": [9, 12, 7]}
BUGS = {None: None, "phys_pos": Invariant.POSITIONS, "keep_rej": Invariant.KV}


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.mark.parametrize("drop", [0, 1])
@pytest.mark.parametrize("bug", list(BUGS))
@pytest.mark.parametrize("prompts", sorted(PROMPTS))
def test_the_api_reads_a_batch_with_holes(pair, prompts: str, bug: str | None, drop: int) -> None:
    ps, budgets = PROMPTS[prompts], BUDGETS[prompts]
    with specviz.watch(pair.target, pair.draft, prompts=ps, name="holes") as w:
        outs, events = holes.generate(pair.target, pair.draft, ps, budgets, bug=bug, w=w, drop=drop)
    report = check_trace(w.trace)
    if bug is None:
        assert outs == shapes.reference(pair.target, ps, budgets) and not events
        assert report.verdict == "clean" and report.exact_match == 1.0, (report.unreadable, report.violations[:3])
        return
    first = report.first_violation
    assert events and first is not None, report.unreadable
    assert (first.step, first.seq_id, first.invariant) == (*events[0], BUGS[bug]), report.violations[:3]


@pytest.mark.parametrize("drop", [0, 1])
@pytest.mark.parametrize("bug", list(BUGS))
@pytest.mark.parametrize("prompts", sorted(PROMPTS))
def test_the_command_reads_a_batch_with_holes(pair, tmp_path: Path, prompts: str, bug: str | None, drop: int) -> None:
    ps, budgets = PROMPTS[prompts], BUDGETS[prompts]
    trace, outs, events = watch_script(tmp_path / "holes.trace.json", "holes", ps, budgets, bug, {"drop": drop})
    assert_command_read(trace, outs, events, shapes.reference(pair.target, ps, budgets), BUGS[bug])
