"""Following a row by its pending token alone (`infer.match.Assignments._unique`'s "weak" reading),
on calls written by hand: a greedy engine with a cache, no draft model, whose batch changes size.

A cached row that no sequence's chain (token and context length) fits is read as the sequence whose
open step could have committed its token, so an engine that moves a row's tokens but not its mask
(a bug) still has the row read as the sequence it fed, where the check can flag the wrong context. A
sequence that has just joined the batch is never such a reading: its first call may have been a
prefill of all but its last prompt token, so its token alone says nothing of a step.

Sequences: A = [5, 6, 7], B = [8, 9, 10], each prefilled but its last token, then stepped; C = [11]
joins (a one-token prefill, no cache attended) in the third call, whose argmax for C is 51, the
same token B's step there commits.
"""

from __future__ import annotations

from watch_calls import target_call as call
from watch_calls import tokens_of

from specviz.watch.autowatch import infer

EOS = frozenset([1])


def run(last_mask: list[int]) -> tuple[list, dict[int, list[int]], list[str], list]:
    """Four calls; the last has two rows: A fed its greedy token, then B's greedy token 51 fed at
    B's position with `last_mask` as its mask. Returns prompts, tokens per sequence, notes, rows."""
    calls = [
        call([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [0, 0], [[99, 98], [99, 98]]),  # 98: never fed next
        call([[7], [10]], 2, [[1, 1, 1], [1, 1, 1]], [2, 2], [[40], [41]]),
        call([[40], [41], [11]], 3, [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]], [3, 3, 0], [[50], [51], [51]]),
        call([[50], [51]], 4, [[1, 1, 1, 1, 1], last_mask], [4, 4], [[60], [61]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    tokens = tokens_of(emits)
    return prompts, tokens, notes, [c.rows for c in calls]


def test_a_row_fed_the_right_mask_is_read_by_its_chain() -> None:
    """The control: B's row attends its four slots, so its chain fits B (and only B)."""
    prompts, tokens, notes, rows = run([1, 1, 1, 1, 1])
    assert prompts == [[5, 6, 7], [8, 9, 10], [11]] and not notes
    assert rows[3] == (0, 1)
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 61], 2: [51]}


def test_a_row_whose_mask_lost_two_slots_is_read_as_the_sequence_its_token_continues() -> None:
    """B's row attends two of its four cache slots (a cache bug): its context fits no sequence's
    chain, and its token 51 is what B's step committed, and also C's argmax. C joined a call ago, so
    51 may be its last prompt token as well as a generated one: the row is B's, never ambiguous."""
    prompts, tokens, notes, rows = run([1, 1, 0, 0, 1])
    assert not notes, notes  # read, not stopped as "fit more than one sequence"
    assert prompts == [[5, 6, 7], [8, 9, 10], [11]]
    assert rows[3] == (0, 1)  # A, then B (C has left the batch)
    # B's token 51 at call 2 is read from the row; 61 is its last step, read as greedy. C's one
    # step is its argmax (the greedy reading of a last step): what a correct engine commits.
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 61], 2: [51]}


def run_three(positions_fed: bool) -> tuple[dict[int, list[int]], list[str], list]:
    """A = [5, 6, 7] and B = [8, 9, 10] (left-padded) and D = [12, 13, 14, 15], each prefilled but
    its last token and stepped twice; B's and D's second steps both commit 51. The last call keeps
    two rows in a cache rebuilt without its padding (so the masks' history is not where it was):
    A fed its greedy 50, then 51 fed at B's position 4 with a mask that lost two of B's four slots
    (a cache bug), so no chain fits it. Returns tokens per sequence, notes, rows."""
    calls = [
        call([[0, 5, 6], [0, 8, 9], [12, 13, 14]], 0, [[0, 1, 1], [0, 1, 1], [1, 1, 1]], [0, 0, 0], [[99] * 3] * 3),
        call([[7], [10], [15]], 3, [[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]], [2, 2, 3], [[40], [41], [42]]),
        call([[40], [41], [42]], 4, [[0, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1] * 5], [3, 3, 4], [[50], [51], [51]]),
        call([[50], [51]], 4, [[1] * 5, [1, 1, 0, 0, 1]], [4, 4], [[60], [61]]),  # padding dropped
    ]
    calls[-1].positions_fed = positions_fed
    notes: list[str] = []
    _, emits = infer(calls, EOS, notes)
    tokens = tokens_of(emits)
    return tokens, notes, [c.rows for c in calls]


def test_the_position_fed_tells_which_sequence_a_row_read_by_its_token_is() -> None:
    """51 is what both B's and D's steps committed; fed at position 4, it follows B's four tokens,
    whereas D's fifth token would sit at 5: the row is B's."""
    tokens, notes, rows = run_three(positions_fed=True)
    assert not notes, notes
    assert rows[3] == (0, 1)
    assert tokens[1] == [41, 51, 61] and tokens[2] == [42, 51]


def test_a_row_whose_token_two_sequences_committed_is_not_guessed() -> None:
    """The same row, with no positions fed: nothing tells B from D, so reading stops at that call
    (said in a note, the call's rows left unread), never a guess and never a crash."""
    tokens, notes, rows = run_three(positions_fed=False)
    assert len(notes) == 1 and "rows [1] of target call 3 fit more than one sequence" in notes[0]
    assert rows[3] is None
    assert tokens[0] == [40, 50] and tokens[1] == [41, 51] and tokens[2] == [42, 51]
