"""Following a row by its pending token alone (`follow_match.Assignments._unique`'s "weak" reading),
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

from specviz.watch.autowatch import infer
from specviz.watch.hooks import CallRecord

EOS = frozenset([1])


def call(ids: list[list[int]], width: int, masks: list[list[int]], positions: list[int], argmax) -> CallRecord:
    """A target call with a cache of `width` slots; each row's 2-D mask and first position given."""
    q = len(ids[0])
    return CallRecord(
        role="target", rows=None, input_ids=ids, positions=[list(range(p, p + q)) for p in positions],
        positions_fed=True, cache_width=width, mask_kind="2d", mask=masks, batch_size=len(ids),
        query_len=q, argmax=argmax,
    )  # fmt: skip


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
    tokens: dict[int, list[int]] = {}
    for e in emits:
        tokens.setdefault(e.seq_id, []).extend(e.tokens)
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
