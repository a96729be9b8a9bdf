"""Chunked prefill mixed into decode in one packed forward (`zoo/chunked.py`, vLLM's scheduler
shape, prompt-lookup drafts): a chunk that stops short of its prompt's end yields no token and is
no step of its sequence. Declared with `w.batch(ids, query_lens=, drafts=, chunk=)`, and
undeclared through `specviz watch --`, where the inferrer reads a call after a no-token prefill
as a chunk when the next call shows the whole query kept and no token chosen from it. Truth is
batch-1 greedy decoding of the target without hooks (`shapes.reference`)."""

from __future__ import annotations

import pytest
from tiny import make_pair
from zoo import chunked, shapes
from zoo.command import watch_script

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


@pytest.mark.parametrize("budget", [2, 3])
def test_the_command_reads_chunks_clean(tmp_path, pair, budget: int) -> None:
    trace, outs, _ = watch_script(tmp_path / "c.json", "chunked", PROMPTS, BUDGETS, options={"budget": budget})
    report = check_trace(trace)
    assert report.verdict == "clean" and not report.violation_count and report.exact_match == 1.0
    assert [s.prompt_ids for s in trace.sequences] == PROMPTS  # each prompt whole, chunks joined
    assert [s.output_ids for s in trace.sequences] == outs == shapes.reference(pair.target, PROMPTS, BUDGETS)


@pytest.mark.parametrize(("bug", "invariant"), [BUGS[0], BUGS[2]])
def test_the_command_locates_bugs_in_and_after_chunks(tmp_path, bug: str, invariant: Invariant) -> None:
    trace, _, events = watch_script(tmp_path / "c.json", "chunked", PROMPTS, BUDGETS, bug=bug)
    first = check_trace(trace).violations[0]
    assert events and (first.step, first.seq_id, first.invariant) == (*events[0], invariant)


def test_a_chunk_that_forgets_its_cache_is_never_clean(tmp_path) -> None:
    """Its final chunk attends no cache, as a new sequence's prefill would: the command cannot
    tell the two apart, so the run reads as a desync or unreadable, never clean."""
    trace, _, events = watch_script(tmp_path / "c.json", "chunked", PROMPTS, BUDGETS, bug="chunk_forgets")
    assert events and check_trace(trace).verdict in ("desync", "unreadable")


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
