"""The row follower's assignments (`specviz/watch/infer/match.py`): `_matchings` enumerates the ways
rows can be given to classes of sequences identical so far (each class holding as many rows as it
has sequences) that assign the most rows. One way is a reading; several are ambiguous, never
guessed. Every expected assignment is enumerated by hand."""

from __future__ import annotations

from types import SimpleNamespace

# The code under test, in one block.
from specviz.watch.infer.match import MATCHINGS, _mask_2d, _matchings


def test_one_row_one_sequence() -> None:
    assert _matchings([4], {4: [0]}, [1]) == [{4: 0}]


def test_no_rows_is_one_empty_assignment() -> None:
    assert _matchings([], {}, [1, 1]) == [{}]


def test_a_row_that_fits_nothing_stays_out() -> None:
    assert _matchings([0, 1], {0: [0], 1: []}, [1]) == [{0: 0}]
    assert _matchings([0], {0: []}, [1]) == [{}]


def test_two_rows_that_fit_only_one_sequence_are_two_ways_not_the_first_rows() -> None:
    """Either row may hold it (the other is then new or idle): two assignments, so the follower
    says ambiguous instead of giving the sequence to row 0 for its place."""
    assert _matchings([0, 1], {0: [0], 1: [0]}, [1]) == [{0: 0}, {1: 0}]
    # A third row that fits the other class keeps it in both ways.
    assert _matchings([0, 1, 2], {0: [0], 1: [0], 2: [1]}, [1, 1]) == [{0: 0, 2: 1}, {1: 0, 2: 1}]


def test_two_rows_for_a_class_of_two_identical_sequences_is_one_way() -> None:
    assert _matchings([0, 1], {0: [0], 1: [0]}, [2]) == [{0: 0, 1: 0}]


def test_only_the_ways_that_assign_the_most_rows() -> None:
    """Row 0 fits class 0 or 1, row 1 only class 0 (one sequence each): giving row 0 class 0 leaves
    row 1 out, so the one way that assigns both is row 0 -> 1, row 1 -> 0."""
    assert _matchings([0, 1], {0: [0, 1], 1: [0]}, [1, 1]) == [{0: 1, 1: 0}]
    # Both rows fit both classes: two ways, both complete.
    assert _matchings([0, 1], {0: [0, 1], 1: [0, 1]}, [1, 1]) == [{0: 0, 1: 1}, {0: 1, 1: 0}]


def test_a_full_class_is_not_offered_again() -> None:
    """Three rows fit class 0 (two sequences) and row 2 also class 1: rows 0 and 1 take class 0 in
    the one way that assigns all three."""
    assert _matchings([0, 1, 2], {0: [0], 1: [0], 2: [0, 1]}, [2, 1]) == [{0: 0, 1: 0, 2: 1}]


def test_the_enumeration_stops_at_matchings() -> None:
    """Six rows that each fit six one-sequence classes: 720 ways, enumerated up to MATCHINGS."""
    rows = list(range(6))
    found = _matchings(rows, {r: rows for r in rows}, [1] * 6)
    assert len(found) == MATCHINGS == 256
    assert found[0] == {r: r for r in rows}  # in order: the first class first
    assert len({tuple(sorted(m.items())) for m in found}) == MATCHINGS  # distinct


def test_a_2d_mask_is_one_of_kind_2d_that_was_kept() -> None:
    assert _mask_2d(SimpleNamespace(mask_kind="2d", mask=[[1]]))
    assert not _mask_2d(SimpleNamespace(mask_kind="2d", mask=None))
    assert not _mask_2d(SimpleNamespace(mask_kind="4d", mask=[[[True]]]))


def test_a_finished_row_fed_again_in_another_place_is_idle() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10], each prefilled but its last token, then stepped greedily
    (2-D masks, a cache that grows by one a call). A's first step commits EOS (1) and its row is fed
    1 again; in the last call the rows swap: B's row first, then A's finished row fed 1 once more.
    That row is read as idle (no step for anyone), not as a row that continues no sequence: A ends
    with [1] by "eos", B gains 41, 51, 61, and nothing stops the reading."""
    from specviz.watch.autowatch import infer
    from specviz.watch.hooks import CallRecord
    from specviz.watch.infer.followed import IDLE

    def call(ids: list[list[int]], width: int, position: int, argmax: list[list[int]]) -> CallRecord:
        q = len(ids[0])
        return CallRecord(
            role="target", rows=None, input_ids=ids, positions=[list(range(position, position + q))] * len(ids),
            positions_fed=True, cache_width=width, mask_kind="2d", mask=[[1] * (width + q) for _ in ids],
            batch_size=len(ids), query_len=q, argmax=argmax,
        )  # fmt: skip

    calls = [
        call([[5, 6], [8, 9]], 0, 0, [[99, 98], [99, 98]]),  # 98: never fed next
        call([[7], [10]], 2, 2, [[1], [41]]),
        call([[1], [41]], 3, 3, [[1], [51]]),
        call([[51], [1]], 4, 4, [[61], [1]]),  # swapped
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset([1]), notes)
    assert prompts == [[5, 6, 7], [8, 9, 10]] and not notes, notes
    assert calls[3].rows == (1, IDLE)
    tokens: dict[int, list[int]] = {}
    for e in emits:
        tokens.setdefault(e.seq_id, []).extend(e.tokens)
    assert tokens == {0: [1], 1: [41, 51, 61]}
    assert [e.finish_reason for e in emits if e.seq_id == 0] == ["eos"]
