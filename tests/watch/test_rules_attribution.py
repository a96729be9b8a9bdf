"""Which target call each declared emission belongs to (`specviz/watch/attribution.py` `attribute`),
on target calls written by hand and emits declared on time, late, in pieces, or ending alone.

One sequence, prompt [5, 6, 7], no draft model (its drafts are the tokens after the pending one):
call 0 prefills it (argmax 40 at 7); call 1 feeds 40 and the draft 20 under argmax [20, 50] (20
kept, then 50); call 2 feeds 50 and the draft 30 under argmax [31, 60] (30 refused, 31 chosen);
call 3 feeds 31 under argmax [70]. So the steps give call 0: 40, call 1: 20, 50, call 2: 31, call
3: 70, however the engine times its emits."""

from __future__ import annotations

from watch_calls import target_call as call

# The code under test, in one block.
from specviz.watch.attribution import Emit, attribute
from specviz.watch.calls import CallReader

STEPS = [(0, [40]), (1, [20, 50]), (2, [31]), (3, [70])]


def calls() -> list:
    made = [
        call([[5, 6, 7]], 0, [[1, 1, 1]], [0], [[99, 99, 40]]),
        call([[40, 20]], 3, [[1] * 5], [3], [[20, 50]]),
        call([[50, 30]], 5, [[1] * 7], [5], [[31, 60]]),
        call([[31]], 6, [[1] * 7], [6], [[70]]),
    ]
    for c in made:
        c.materialize()
    return made


def emit(tokens: list[int], after: int, reason: str | None = None) -> Emit:
    return Emit(0, tokens, reason, after, 0.0)


def groups(emits: list[Emit]) -> tuple[list[tuple[int, list[int], str | None, list[int]]], list[str]]:
    """(call, tokens, finish reason, cuts) per group, and the notes."""
    notes: list[str] = []
    found = attribute(emits, [[5, 6, 7]], CallReader(calls()), notes, True)
    return [(g.call, g.tokens, g.finish_reason, g.cuts) for g in found], notes


def test_emits_on_time_are_each_their_calls_step() -> None:
    found, notes = groups([emit([40], 1), emit([20, 50], 2), emit([31], 3), emit([70], 4, "length")])
    assert not notes, notes
    assert found == [(c, t, "length" if c == 3 else None, []) for c, t in STEPS]


def test_each_bonus_emitted_late_with_the_next_steps_tokens_is_its_own_steps() -> None:
    """An engine that emits the token it feeds as pending: 40 with call 1's 20, then 50 (call 1's
    bonus) after call 2, 31 (call 2's choice) after call 3, then 70 with the ending. Each first
    token is the newest call's pending one, which the call before chose: the same steps as on time."""
    found, notes = groups([emit([40, 20], 2), emit([50], 3), emit([31], 4), emit([70], 4, "length")])
    assert not notes, notes
    assert found == [(c, t, "length" if c == 3 else None, []) for c, t in STEPS]


def test_a_sequence_that_ended_on_a_late_bonus_gets_no_step_of_the_call_that_fed_it() -> None:
    """The run ends on 50, call 1's bonus, emitted late (after call 2, which fed it) with the ending:
    call 1's step gains 50 and ends there; call 2's row gave nothing (idle), so it has no group."""
    found, notes = groups([emit([40, 20], 2), emit([50], 3, "length")])
    assert not notes, notes
    assert found == [(0, [40], None, []), (1, [20, 50], "length", [])]


def test_a_step_emitted_in_pieces_and_then_its_ending_alone() -> None:
    """Call 1's step emitted as 20, then 50 (no newer call between): one group, cut where the second
    piece was appended; then the ending alone (no tokens): the group's ending, no cut."""
    found, notes = groups([emit([40], 1), emit([20], 2), emit([50], 2), emit([], 2, "length")])
    assert not notes, notes
    assert found == [(0, [40], None, []), (1, [20, 50], "length", [1])]


def test_an_emit_before_any_call_held_the_sequence_is_no_step() -> None:
    found, notes = groups([emit([40], 0)])
    assert found == []
    assert notes == ["emit for sequence 0 matches no target call that fed its pending token; not a step"]


def test_an_emit_after_the_sequences_only_call_is_not_split_for_an_earlier_call() -> None:
    """The watch saw no prefill (it began at the first verify): its only call fed 40 (the unseen
    prefill's choice) and the draft 40 under argmax [40, 50] (a model that repeats: 40 kept). The
    emit [40, 40] starts with the token that call fed as pending, as a late bonus would, but no
    earlier call is there to have chosen it: the whole emit is that call's step."""
    only = call([[40, 40]], 3, [[1] * 5], [3], [[40, 50]])
    only.materialize()
    notes: list[str] = []
    found = attribute([emit([40, 40], 1)], [[5, 6, 7]], CallReader([only]), notes, True)
    assert not notes, notes
    assert [(g.call, g.tokens) for g in found] == [(0, [40, 40])]
