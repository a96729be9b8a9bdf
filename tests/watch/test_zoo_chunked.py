"""Chunked prefill mixed into decode in one packed forward (`zoo/chunked.py`, vLLM's scheduler
shape, prompt-lookup drafts), declared with `w.batch(ids, query_lens=, drafts=, chunk=)`: a chunk
that stops short of its prompt's end yields no token and is no step of its sequence. Truth is
batch-1 greedy decoding of the target without hooks (`shapes.reference`)."""

from __future__ import annotations

import pytest
from tiny import make_pair
from zoo import chunked, shapes

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant
from specviz.watch import WatchError

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]
BUGS = [("chunk_positions", Invariant.POSITIONS), ("chunk_forgets", Invariant.KV), ("kv_leak", Invariant.KV)]


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def watched(pair, bug=None, **options):
    with specviz.watch(pair.target, prompts=PROMPTS, name="chunked") as w:
        outs, events = chunked.generate(pair.target, None, PROMPTS, BUDGETS, bug=bug, w=w, declare=1, **options)
    return check_trace(w.trace), outs, events


@pytest.mark.parametrize("budget", [2, 3])
def test_declared_chunks_read_clean_and_equal_batch1_greedy(pair, budget: int) -> None:
    report, outs, events = watched(pair, budget=budget)
    assert outs == shapes.reference(pair.target, PROMPTS, BUDGETS) and not events
    assert report.verdict == "clean" and not report.violation_count and report.exact_match == 1.0


@pytest.mark.parametrize(("bug", "invariant"), BUGS)
def test_each_injected_bug_is_located_where_it_happens(pair, bug: str, invariant: Invariant) -> None:
    report, outs, events = watched(pair, bug=bug)
    assert events, f"{bug} never fired"
    first = report.violations[0]
    assert (first.step, first.seq_id, first.invariant) == (*events[0], invariant)
    assert report.verdict != "clean"
    if outs != shapes.reference(pair.target, PROMPTS, BUDGETS):
        assert report.exact_match < 1.0  # never clean on a wrong output


def test_a_malformed_declaration_is_one_line(pair) -> None:
    with specviz.watch(pair.target, prompts=PROMPTS) as w:
        with pytest.raises(WatchError, match="entries in drafts= and chunk="):
            w.batch([0, 1], query_lens=[2, 3], drafts=[0])
        with pytest.raises(WatchError, match="a chunk none"):
            w.batch([0, 1], query_lens=[2, 3], drafts=[1, 0], chunk=[True, False])
        with pytest.raises(WatchError, match="fewer than its query"):
            w.batch([0, 1], query_lens=[2, 3], drafts=[2, 0])
        with pytest.raises(WatchError, match="one bool per sequence"):
            w.batch([0, 1], chunk=[1, 0])
        w.emit(0, [1], "eos")
        for s in range(1, len(PROMPTS)):
            w.emit(s, [1], "eos")
        w.close(reference=False, complete=False)
