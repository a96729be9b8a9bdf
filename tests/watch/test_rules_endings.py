"""How each sequence of a watched run ended (`specviz/watch/attribution.py`), on emits and groups written
by hand: outputs as emitted, endings declared or read from an emitted EOS (per step and per
sequence), each sequence's own budget and the run's (`max_new_tokens`, never declared), and the
sequences that reached it without an ending of their own."""

from __future__ import annotations

# The code under test, in one block.
from specviz.watch.attribution import Emit, Group, budgets, close_by_length, endings

EOS = frozenset([1, 2])
PROMPTS = [[5, 6], [7], [8, 9, 10]]


def emit(seq: int, tokens: list[int], reason: str | None = None) -> Emit:
    return Emit(seq, tokens, reason, after=0, at=0.0)


def group(seq: int, tokens: list[int], reason: str | None = None) -> Group:
    return Group(seq, tokens, reason, 0, 0.0)


def test_outputs_are_what_each_sequence_was_emitted_in_order() -> None:
    """Sequence 0 gets 30, 31 then 32; sequence 1 nothing; sequence 2 an EOS (2) in the middle of
    its step (40, 2, 41: the EOS is the ending whatever follows). No ending declared: 0 has none
    yet, 1 none, 2 ended by "eos". A declared ending stands, a later emit without one keeps it."""
    outputs, reasons = endings([], [emit(0, [30, 31]), emit(2, [40, 2, 41]), emit(0, [32])], PROMPTS, EOS)
    assert outputs == {0: [30, 31, 32], 1: [], 2: [40, 2, 41]}
    assert reasons == {0: None, 1: None, 2: "eos"}
    declared = [emit(0, [30], "length"), emit(0, [31]), emit(1, [1], "stop")]
    outputs, reasons = endings([], declared, PROMPTS, EOS)
    assert outputs == {0: [30, 31], 1: [1], 2: []}
    assert reasons == {0: "length", 1: "stop", 2: None}  # declared: its EOS does not override it


def test_a_step_that_emitted_an_eos_ends_there_unless_its_ending_was_said() -> None:
    steps = [group(0, [30, 31]), group(0, [1]), group(1, [50, 2]), group(2, [60], "stop"), group(2, [1], "length")]
    endings(steps, [], PROMPTS, EOS)
    assert [g.finish_reason for g in steps] == [None, "eos", "eos", "stop", "length"]


def test_the_budget_is_the_longest_ending_by_length_else_the_longest_output() -> None:
    outputs = {0: [30, 31, 32], 1: [40], 2: [50, 51]}
    own, max_new = budgets(outputs, {0: "eos", 1: "length", 2: "length"})
    assert own == {1: 1, 2: 2} and max_new == 2  # 0 ended by EOS: longer, not the budget
    own, max_new = budgets(outputs, {0: "eos", 1: None, 2: "stop"})
    assert own == {} and max_new == 3  # none by length: the longest output
    assert budgets({0: [], 1: []}, {0: None, 1: None}) == ({}, 0)
    assert budgets({}, {}) == ({}, 0)


def test_a_sequence_that_reached_the_budget_without_an_ending_ended_by_length() -> None:
    """Budget 2: sequence 0 has 3 tokens and no ending (length), 1 has 1 (still none), 2 has 2 and
    ended by EOS (kept). Each sequence's last step without its own ending takes the sequence's;
    an earlier step keeps none, and a step's own ending stands."""
    outputs = {0: [30, 31, 32], 1: [40], 2: [50, 1]}
    reasons: dict[int, str | None] = {0: None, 1: None, 2: "eos"}
    steps = [group(0, [30]), group(0, [31, 32]), group(1, [40]), group(2, [50]), group(2, [1], "stop")]
    close_by_length(steps, outputs, reasons, 2)
    assert reasons == {0: "length", 1: None, 2: "eos"}
    assert [g.finish_reason for g in steps] == [None, "length", None, None, "stop"]
    # Exactly at the budget ends by length; a budget of 0 (nothing generated) ends nothing so.
    reasons = {0: None, 1: None, 2: None}
    close_by_length([], {0: [30, 31], 1: [40], 2: []}, reasons, 2)
    assert reasons == {0: "length", 1: None, 2: None}
    reasons = {0: None}
    close_by_length([], {0: []}, reasons, 0)
    assert reasons == {0: None}
