"""The row follower's assignments (`specviz/watch/infer/match.py`): `_matchings` enumerates the ways
rows can be given to classes of sequences identical so far (each class holding as many rows as it
has sequences) that assign the most rows. One way is a reading; several are ambiguous, never
guessed. Every expected assignment is enumerated by hand."""

from __future__ import annotations

from watch_calls import target_call as call
from watch_calls import tokens_of

# The code under test, in one block.
from specviz.watch.infer.match import MATCHINGS, _columns, _matchings
from specviz.watch.record import CallRecord
from specviz.watch.view import read_views


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


def test_a_rows_2d_mask_columns_are_read_from_its_view_where_it_was_fed_one() -> None:
    def call(kind: str, mask) -> CallRecord:
        made = CallRecord("target", None, [[5]], [[2]], True, 2, kind, mask, 1, 1)
        made.views = read_views(made)  # as `materialize` reads them
        return made

    assert _columns(call("2d", [[0, 1, 1]]), 0) == [0, 1, 1]
    assert _columns(call("2d", None), 0) is None  # none kept: nothing to compare
    assert _columns(call("4d", [[[True, True, True]]]), 0) is None


def stepped(ids: list[list[int]], width: int, position: int, argmax: list[list[int]]) -> CallRecord:
    """A target call whose rows attend their whole cache of `width` slots and query, fed at `position`."""
    q = len(ids[0])
    return call(ids, width, [[1] * (width + q) for _ in ids], [position] * len(ids), argmax)


def test_a_finished_row_fed_again_in_another_place_is_idle() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10], each prefilled but its last token, then stepped greedily
    (2-D masks, a cache that grows by one a call). A's first step commits EOS (1) and its row is fed
    1 again; in the last call the rows swap: B's row first, then A's finished row fed 1 once more.
    That row is read as idle (no step for anyone), not as a row that continues no sequence: A ends
    with [1] by "eos", B gains 41, 51, 61, and nothing stops the reading."""
    from specviz.watch.autowatch import infer
    from specviz.watch.infer.match import IDLE

    calls = [
        stepped([[5, 6], [8, 9]], 0, 0, [[99, 98], [99, 98]]),  # 98: never fed next
        stepped([[7], [10]], 2, 2, [[1], [41]]),
        stepped([[1], [41]], 3, 3, [[1], [51]]),
        stepped([[51], [1]], 4, 4, [[61], [1]]),  # swapped
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset([1]), notes)
    assert prompts == [[5, 6, 7], [8, 9, 10]] and not notes, notes
    assert calls[3].rows == (1, IDLE)
    tokens = tokens_of(emits)
    assert tokens == {0: [1], 1: [41, 51, 61]}
    assert [e.finish_reason for e in emits if e.seq_id == 0] == ["eos"]


def _position_tie(b_position: int) -> tuple[dict[int, list[int]], list[str], list]:
    """A = [5, 6, 7], B = [8, 9, 10] (left-padded), D = [12, 13, 14, 15] and E = [16, 17, 18, 19],
    each prefilled but its last token and stepped twice (greedy, 2-D masks, positions fed); B's and
    D's second steps both commit 51, E's commits 53. The last call keeps three rows in a cache
    rebuilt without its padding (the masks' history is not where it was): A fed its greedy 50 with
    its whole mask, then 51 fed at `b_position` and E's 53 fed at E's position 5, both with masks
    that lost two slots (a cache bug), so no chain fits either. Row 2 can only be E (53 is no other
    step's); row 1 is B or D by its token. Returns tokens per sequence, notes, rows."""
    from specviz.watch.autowatch import infer

    pad, full = [0, 1, 1], [1, 1, 1]
    calls = [
        call([[0, 5, 6], [0, 8, 9], [12, 13, 14], [16, 17, 18]], 0, [pad, pad, full, full], [0] * 4, [[99] * 3] * 4),
        call([[7], [10], [15], [19]], 3, [[0, 1, 1, 1]] * 2 + [[1] * 4] * 2, [2, 2, 3, 3], [[40], [41], [42], [43]]),
        call(
            [[40], [41], [42], [43]], 4, [[0, 1, 1, 1, 1]] * 2 + [[1] * 5] * 2, [3, 3, 4, 4], [[50], [51], [51], [53]]
        ),
        call(
            [[50], [51], [53]], 4, [[1] * 5, [1, 1, 0, 0, 1], [1, 1, 0, 0, 1]], [4, b_position, 5], [[60], [61], [63]]
        ),
    ]
    notes: list[str] = []
    _, emits = infer(calls, frozenset([1]), notes)
    tokens = tokens_of(emits)
    return tokens, notes, [c.rows for c in calls]


def test_a_tie_beside_an_uncontested_row_is_told_apart_by_the_position_fed() -> None:
    """Row 1's 51 fed at position 4 follows B's four tokens (D's next would sit at 5): B's. Row 2 is
    E's alone (an uncontested pair, whose position agrees, so the positions are trusted this call).
    The tie beside it is still broken: every row read, no note; a correct engine reads clean."""
    tokens, notes, rows = _position_tie(4)
    assert not notes, notes
    assert rows[3] == (0, 1, 3)
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 61], 2: [42, 51], 3: [43, 53, 63]}


def test_a_tie_that_every_position_rules_out_stands() -> None:
    """The same row fed 51 at position 6, which neither B (4) nor D (5) would be at: the evidence
    rules out both pairs, so neither goes (the tie stands, the row is not read as continuing
    nothing) and reading stops there as ambiguous, never a guess."""
    tokens, notes, rows = _position_tie(6)
    assert len(notes) == 1 and "rows [1] of target call 3 fit more than one sequence" in notes[0], notes
    assert rows[3] is None
    assert tokens == {0: [40, 50], 1: [41, 51], 2: [42, 51], 3: [43, 53]}


def test_greedy_acceptance_tells_apart_a_row_whose_token_two_steps_could_commit() -> None:
    """No draft model (drafts fed after the pending token), 2-D masks, no positions fed.
    B = [8, 9, 10], D = [12, 13, 14], E = [16, 17, 18], each prefilled but its last token; then one
    step each with two drafts: B [20, 21] under argmax [20, 25, 99] (a greedy engine keeps 20, then
    25), D [30, 31] under [33, 25, 99] (keeps none, then 33), E [40, 41] under [1, 99, 99] (EOS: it
    leaves). Next call, two rows: 25 after four slots (B's cache, the rejected 21 masked), then 33
    after three (D's). The first row's chain fits B and D alike (25 is what D's step commits after
    taking one draft, too); greedy acceptance agrees with B there (it took one) and not with D (it
    took none), and with D at the second row: the rows are B's and D's, both read, no note. (Read
    against greedy acceptance, the first row would be D's and D's own row would continue nothing.)"""
    from specviz.watch.autowatch import infer
    from specviz.watch.hooks import CallRecord

    def call(ids: list[list[int]], width: int, masks: list[list[int]], argmax) -> CallRecord:
        q = len(ids[0])
        return CallRecord(
            role="target", rows=None, input_ids=ids, positions=[list(range(width, width + q))] * len(ids),
            positions_fed=False, cache_width=width, mask_kind="2d", mask=masks, batch_size=len(ids),
            query_len=q, argmax=argmax,
        )  # fmt: skip

    calls = [
        call([[8, 9], [12, 13], [16, 17]], 0, [[1, 1]] * 3, [[99, 99]] * 3),  # 99: never fed next
        call([[10, 20, 21], [14, 30, 31], [18, 40, 41]], 2, [[1] * 5] * 3, [[20, 25, 99], [33, 25, 99], [1, 99, 99]]),
        call(
            [[25, 26, 27], [33, 34, 35]],
            5,
            [[1, 1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 0, 0, 1, 1, 1]],
            [[26, 28, 29], [1, 51, 52]],
        ),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset([1]), notes)
    assert not notes, notes
    assert prompts == [[8, 9, 10], [12, 13, 14], [16, 17, 18]]
    assert calls[2].rows == (0, 1)
    tokens = tokens_of(emits)
    assert tokens == {0: [20, 25, 26, 28], 1: [33, 1], 2: [1]}


def test_the_position_fed_tells_how_many_drafts_a_step_read_by_its_token_took() -> None:
    """No draft model, 2-D masks, positions fed. B = [8, 9, 10] (left-padded), D = [12, 13, 14, 15]
    and E = [16, 17, 18, 19], each prefilled but its last token, then one step with two drafts: B
    [20, 21] under argmax [20, 25, 99] (keeps 20, then 25), D [30, 31] under [1, 25, 99] (EOS), E
    [40, 41] under [1, 99, 99] (EOS). The next call keeps one row in a cache rebuilt without its
    padding (no mask history to read): 25 fed at position 4 with a mask that lost two slots (a
    cache bug), so no chain fits and it is read by its token, which B's step commits after one
    draft and D's would too. Position 4 is B's three tokens plus the one draft taken; D's would
    be 5: the row is B's, its step [20, 25], and nothing stops the reading."""
    from specviz.watch.autowatch import infer

    calls = [
        call([[0, 8, 9], [12, 13, 14], [16, 17, 18]], 0, [[0, 1, 1], [1, 1, 1], [1, 1, 1]], [0, 0, 0], [[99] * 3] * 3),
        call(
            [[10, 20, 21], [15, 30, 31], [19, 40, 41]],
            3,
            [[0, 1, 1, 1, 1, 1], [1] * 6, [1] * 6],
            [2, 3, 3],
            [[20, 25, 99], [1, 25, 99], [1, 99, 99]],
        ),
        call([[25, 26, 27]], 5, [[1, 1, 0, 0, 0, 1, 1, 1]], [4], [[26, 28, 29]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset([1]), notes)
    assert not notes, notes
    assert prompts == [[8, 9, 10], [12, 13, 14, 15], [16, 17, 18, 19]]
    assert calls[2].rows == (0,)
    tokens = tokens_of(emits)
    assert tokens == {0: [20, 25, 26, 28], 1: [1], 2: [1]}


def test_a_chunk_of_a_prompt_sits_after_the_whole_chunk() -> None:
    """No draft model, 2-D masks, positions fed. P = [5, 6, 7, 8, 9, 10] is prefilled in chunks of
    two ([5, 6] without a cache, [7, 8], then [9, 10], whose argmax 40 is fed next); R = [11, 12,
    13] beside it is prefilled but its last token, then steps: 97, 50, then 60. R's 97 is also what
    the target chose after P's 7, so when the rows swap in the third call, R's row (97 after three
    slots, at position 3) fits P as a step as well as R, while P's row ([9, 10] after four slots)
    fits P only as a chunk of its prompt. The position fed to 9, 4, sits after the whole chunk [7,
    8]: the chunk reading agrees, so P's row is P's and R's row R's, and nothing stops the reading
    (P: 40, then EOS; R: 97, 50, 60). Were the chunk ruled out there, R's row would fit two
    sequences that differ, and reading would stop."""
    from specviz.watch.autowatch import infer

    calls = [
        call([[5, 6], [11, 12]], 0, [[1, 1], [1, 1]], [0, 0], [[99, 98], [99, 98]]),  # 98: never fed next
        call([[7, 8], [13, 0]], 2, [[1] * 4, [1, 1, 1, 0]], [2, 2], [[97, 96], [97, 0]]),  # R right-padded
        call([[97, 0], [9, 10]], 4, [[1, 1, 1, 0, 1, 0], [1] * 6], [3, 4], [[50, 0], [95, 40]]),
        call([[50], [40]], 6, [[1, 1, 1, 0, 1, 0, 1], [1] * 7], [4, 6], [[60], [1]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset([1]), notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    assert [c.rows for c in calls] == [(0, 1), (0, 1), (1, 0), (1, 0)]
    tokens = tokens_of(emits)
    assert tokens == {0: [40, 1], 1: [97, 50, 60]}


def test_a_note_names_every_row_of_a_tie_one_sequence_leaves() -> None:
    """A = [5, 6, 7], B = [8, 9, 10] and C = [11, 12, 13], each prefilled but its last token and
    stepped (40, 41, 42); the next call has two rows, both fed 40 after A's three slots. Each fits
    A only, so either row holds it and the other none: reading stops there, and the note names
    both rows, not only the one the first way leaves out."""
    from specviz.watch.autowatch import infer

    calls = [
        call([[5, 6], [8, 9], [11, 12]], 0, [[1, 1]] * 3, [0] * 3, [[99, 99]] * 3),
        call([[7], [10], [13]], 2, [[1, 1, 1]] * 3, [2] * 3, [[40], [41], [42]]),
        call([[40], [40]], 3, [[1, 1, 1, 1]] * 2, [3, 3], [[50], [50]]),
    ]
    notes: list[str] = []
    infer(calls, frozenset([1]), notes)
    assert len(notes) == 1 and "rows [0, 1] of target call 2" in notes[0], notes


def test_a_sequence_that_sat_out_a_call_is_read_when_it_returns() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10], each prefilled but its last token, then stepped greedily
    (2-D masks, positions fed). The third call holds A's row alone (B sits it out: it is left out
    of a call that holds A, which shared its last call); the fourth holds B's row alone, fed its
    greedy 41 at position 3 over its cache of 3. That row continues no sequence present (A's step
    commits 50, at position 4), so it is B coming back: B gains 41, 51, A gains 40, 50, no note."""
    from specviz.watch.autowatch import infer

    calls = [
        stepped([[5, 6], [8, 9]], 0, 0, [[99, 98], [99, 98]]),  # 98: never fed next
        stepped([[7], [10]], 2, 2, [[40], [41]]),
        stepped([[40]], 3, 3, [[50]]),  # A alone: B sits out
        stepped([[41]], 3, 3, [[51]]),  # B alone, back
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset([1]), notes)
    assert prompts == [[5, 6, 7], [8, 9, 10]] and not notes, notes
    assert calls[2].rows == (0,) and calls[3].rows == (1,)
    assert tokens_of(emits) == {0: [40, 50], 1: [41, 51]}
