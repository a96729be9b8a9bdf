"""The continuous-batching capture's comparison of the engine's own emits with the manager's report
(`specviz/watch/paged.py`: `_first_difference`, `reconcile`, `engine_emit`), on hand-written
emits: where they first disagree (which output token, after which call) and which target call is
then marked unreadable. Agreeing emits (the same tokens, the same or no ending) say nothing."""

from __future__ import annotations

from types import SimpleNamespace

# The code under test, in one block.
from specviz.watch.attribution import Emit
from specviz.watch.paged import PagedCapture, _first_difference
from specviz.watch.record import CallRecord

TAIL = " (transformers' continuous batching manager and w.emit disagree)"


def said(seq_id: int, tokens: list[int], after: int, reason: str | None = None) -> Emit:
    return Emit(seq_id=seq_id, tokens=tokens, finish_reason=reason, after=after, at=0.0)


# The manager's report for one sequence: 2 tokens after call 2, 1 after call 4, ended by eos.
REPORT = [said(0, [5, 6], 2), said(0, [7], 4, "eos")]


def test_the_same_tokens_and_ending_agree() -> None:
    assert _first_difference(REPORT, [([5], None), ([6, 7], None)]) is None  # split otherwise: fine
    assert _first_difference(REPORT, [([5, 6, 7], "eos")]) is None
    assert _first_difference([], []) is None


def test_another_token_is_located_after_the_call_that_reported_it() -> None:
    assert _first_difference(REPORT, [([5, 6, 9], None)]) == (
        4,
        "the engine emitted 9 as output token 2, the manager reported 7" + TAIL,
    )
    assert _first_difference(REPORT, [([4], None)]) == (
        2,
        "the engine emitted 4 as output token 0, the manager reported 5" + TAIL,
    )


def test_a_token_less_is_located_at_the_first_one_missing() -> None:
    assert _first_difference(REPORT, [([5, 6], None)]) == (
        4,
        "the engine emitted 2 tokens, the manager reported 3" + TAIL,
    )
    assert _first_difference(REPORT, [([5], None)]) == (2, "the engine emitted 1 tokens, the manager reported 3" + TAIL)


def test_a_token_more_is_located_after_the_last_report() -> None:
    assert _first_difference(REPORT, [([5, 6, 7, 8], None)]) == (
        4,
        "the engine emitted 4 tokens, the manager reported 3" + TAIL,
    )
    assert _first_difference([], [([8], None)]) == (0, "the engine emitted 1 tokens, the manager reported 0" + TAIL)


def test_another_ending_is_located_after_the_last_report() -> None:
    assert _first_difference(REPORT, [([5, 6, 7], "length")]) == (
        4,
        "the engine ended it by 'length', the manager by 'eos'" + TAIL,
    )
    # The last ending declared counts, from either side.
    assert _first_difference(REPORT, [([5, 6], "length"), ([7], "eos")]) is None
    unended = [said(0, [5], 1)]
    assert _first_difference(unended, [([5], "eos")]) == (1, "the engine ended it by 'eos', the manager by None" + TAIL)


def call(role: str) -> CallRecord:
    """A one-token call of `role`: reconcile reads its role and what it says of being unreadable."""
    fed = {"rows": None, "input_ids": [[5]], "positions": [[0]], "positions_fed": True, "cache_width": 0}
    return CallRecord(role=role, mask_kind="none", mask=None, batch_size=1, query_len=1, **fed)


def test_reconcile_marks_the_target_call_that_made_the_first_differing_token() -> None:
    """Calls: target 0, draft 1, target 2, draft 3, target 4. The manager reported token 2 of
    sequence 0 after call 4 (made by target call 2, the last target before it); sequence 1 agrees."""
    calls = [call("target"), call("draft"), call("target"), call("draft"), call("target")]
    capture = PagedCapture(SimpleNamespace(), None)
    capture.named = {0, 1}
    assert capture.engine_emit(0, [5, 6, 9], None) and capture.engine_emit(1, [8], None)
    capture.reconcile(calls, [*REPORT, said(1, [8], 2)])
    assert [c.unreadable for c in calls] == [
        None,
        None,
        "sequence 0: " + _first_difference(REPORT, [([5, 6, 9], None)])[1],
        None,
        None,
    ]


def test_reconcile_of_a_sequence_the_manager_never_wrote_to_marks_the_first_target_call() -> None:
    calls = [call("draft"), call("target"), call("target")]
    capture = PagedCapture(SimpleNamespace(), None)
    capture.named = {3}
    capture.engine_emit(3, [8], "eos")
    capture.reconcile(calls, [])
    assert calls[0].unreadable is None and calls[2].unreadable is None
    assert calls[1].unreadable.startswith("sequence 3: the engine emitted 1 tokens, the manager reported 0")


def test_reconcile_keeps_an_earlier_reason() -> None:
    calls = [call("target"), call("target")]
    calls[0].unreadable = "rows declares 3 sequences"
    capture = PagedCapture(SimpleNamespace(), None)
    capture.named = {0}
    capture.engine_emit(0, [4], None)
    capture.reconcile(calls, [said(0, [5], 1)])
    assert calls[0].unreadable == "rows declares 3 sequences"


def test_an_emit_for_a_sequence_the_manager_never_named_is_the_engines_word() -> None:
    capture = PagedCapture(SimpleNamespace(), None)
    capture.named = {0}
    assert not capture.engine_emit(1, [5], None) and capture.engine == {}
    assert capture.engine_emit(0, [5], None) and capture.engine_emit(0, [6], "eos")
    assert capture.engine == {0: [([5], None), ([6], "eos")]}


def test_reconcile_marks_the_call_that_made_the_token_whatever_an_earlier_call_says() -> None:
    """Target call 0 is unreadable already (another reason); the first difference is in the token
    reported after call 2, made by target call 1: call 1 gets the reason, call 0 keeps its own. And
    where call 1 had a reason already, it keeps it (call 0 is not marked instead)."""
    calls = [call("target"), call("target"), call("target")]
    calls[0].unreadable = "an earlier reason"
    capture = PagedCapture(SimpleNamespace(), None)
    capture.named = {0}
    capture.engine_emit(0, [5, 9], None)
    capture.reconcile(calls, [said(0, [5], 1), said(0, [6], 2)])
    assert calls[0].unreadable == "an earlier reason" and calls[2].unreadable is None
    assert calls[1].unreadable == "sequence 0: the engine emitted 9 as output token 1, the manager reported 6" + TAIL
    calls = [call("target"), call("target"), call("target")]
    calls[1].unreadable = "an earlier reason"
    capture.reconcile(calls, [said(0, [5], 1), said(0, [6], 2)])
    assert calls[0].unreadable is None and calls[1].unreadable == "an earlier reason"
