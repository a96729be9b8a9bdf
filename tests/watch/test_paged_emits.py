"""An engine that drives transformers' continuous batching manager AND calls `w.emit` (the zoo's
`paged` engine with `emit="step"`: each forward's new tokens, emitted from inside the manager's own
update; `emit="end"`: each request's tokens after the run). The manager's report is the reading
(`watch.paged`): the engine's emits for the same requests are compared with it, never added, so
the correct run checks clean with each token counted once; where the engine's emits disagree with
the report, the run is unreadable from the step of the first difference, never clean, never summed.
The oracle is batch-1 greedy decoding of the target (`shapes.reference`, no hooks)."""

from __future__ import annotations

import pytest
from tiny import make_pair
from zoo import paged, shapes

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]  # a budget per request: the manager driven directly
ONE_BUDGET = 8  # one for all: `generate_batch` itself

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def target():
    return make_pair("llama").target


def written(trace) -> dict[int, int]:
    """Tokens each sequence was written in the trace's steps."""
    out = {s.seq_id: 0 for s in trace.sequences}
    for step in trace.steps:
        for row in step.rows:
            out[row.write_seq] += len(row.emitted)
    return out


class Altered:
    """The watch, seen through an engine whose emits go wrong at its `at`-th emit: `change`
    returns the tokens it emits instead (None: it drops that emit)."""

    def __init__(self, w, at: int, change) -> None:
        self.w, self.at, self.change, self.count, self.said = w, at, change, 0, None

    def emit(self, seq: int, tokens, finish_reason=None) -> None:
        self.count += 1
        if self.count == self.at:
            self.said = (seq, list(tokens))
            tokens = self.change(list(tokens))
            if tokens is None:
                return
        self.w.emit(seq, tokens, finish_reason)


@pytest.mark.parametrize(("emit", "budgets"), [("step", BUDGETS), ("end", BUDGETS), ("end", ONE_BUDGET)])
def test_engine_emits_agreeing_with_the_manager_are_counted_once(target, emit: str, budgets) -> None:
    expected = shapes.reference(target, PROMPTS, budgets)
    with specviz.watch(target, prompts=PROMPTS, name=f"paged-emit-{emit}") as w:
        outs, _ = paged.generate(target, None, PROMPTS, budgets, w=w, emit=emit)
    assert outs == expected
    report = check_trace(w.trace)
    assert report.verdict == "clean" and not report.violation_count, (report.verdict, report.violations[:3])
    assert report.exact_match == 1.0 and report.unreadable is None
    assert [s.output_ids for s in w.trace.sequences] == outs
    assert [written(w.trace)[s] for s in range(len(PROMPTS))] == [len(o) for o in outs]  # once each


def test_bug_is_located_with_the_engine_emitting_too(target) -> None:
    with specviz.watch(target, prompts=PROMPTS, name="paged-emit-leak") as w:
        _, events = paged.generate(target, None, PROMPTS, BUDGETS, bug="kv_leak", w=w, emit="step")
    v = check_trace(w.trace).first_violation
    assert events and v is not None
    assert (v.step, v.seq_id, v.invariant) == (*events[0], Invariant.KV)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda tokens: [(tokens[0] + 1) % 96] + tokens[1:], "as output token"),  # another token
        (lambda tokens: None, "the manager reported"),  # one step's tokens never emitted
        (lambda tokens: tokens + tokens, "the manager reported"),  # a token twice
    ],
    ids=["other-token", "dropped", "doubled"],
)
def test_engine_emits_disagreeing_with_the_manager_are_unreadable_not_summed(target, change, words: str) -> None:
    """The engine's 7th emit (step 1 or later) goes wrong: the trace keeps the manager's tokens,
    and the run is unreadable from the step that made the first token the two disagree on, with
    both versions in the reason; the steps before it are checked as usual (none broke)."""
    with specviz.watch(target, prompts=PROMPTS, name="paged-emit-wrong") as w:
        engine = Altered(w, 7, change)
        outs, _ = paged.generate(target, None, PROMPTS, BUDGETS, w=engine, emit="step")
    seq, _ = engine.said
    report = check_trace(w.trace)
    assert report.verdict == "unreadable" and not report.violation_count, (report.verdict, report.violations[:3])
    why = report.unreadable["why"]
    assert f"sequence {seq}:" in why and words in why and "disagree" in why
    assert 0 < report.unreadable["step"] < len(outs[seq])
    by_seq = {s.seq_id: s.output_ids for s in w.trace.sequences}
    assert by_seq[seq] == outs[seq]  # the manager's tokens, not the engine's nor both


class Misended:
    """The watch, seen through an engine that emits every token right but ends its first ending
    sequence by the other reason ("eos" for "length" and back)."""

    def __init__(self, w) -> None:
        self.w, self.seq = w, None

    def emit(self, seq: int, tokens, finish_reason=None) -> None:
        if finish_reason is not None and self.seq is None:
            self.seq, finish_reason = seq, {"eos": "length", "length": "eos"}[finish_reason]
        self.w.emit(seq, tokens, finish_reason)


def test_an_engine_ending_a_request_otherwise_than_the_manager_is_unreadable(target) -> None:
    with specviz.watch(target, prompts=PROMPTS, name="paged-emit-ending") as w:
        engine = Misended(w)
        paged.generate(target, None, PROMPTS, BUDGETS, w=engine, emit="step")
    report = check_trace(w.trace)
    assert report.verdict == "unreadable" and not report.violation_count, (report.verdict, report.violations[:3])
    assert f"sequence {engine.seq}: the engine ended it by 'eos', the manager by 'length'" in report.unreadable["why"]
