"""The row follower's own rules (`specviz/watch/infer/follow.py`), on target calls written by hand:
which sequence each row of a call holds when rows move, when a cacheless loop starts fresh prompts,
and in a shared cache (a packed call's rows), where the slots a row attends name its sequence.
Every expected prompt, row and token is worked out in the test's docstring."""

from __future__ import annotations

import torch
from watch_calls import tokens_of

# The code under test, in one block.
from specviz.watch.autowatch import infer
from specviz.watch.hooks import CallRecord

EOS = frozenset([1])


def padded(ids: list[list[int]], width: int, masks: list[list[int]], argmax) -> CallRecord:
    """A target call of a padded batch: a cache of `width` slots, each row's 2-D mask given."""
    q = len(ids[0])
    return CallRecord(
        role="target", rows=None, input_ids=ids, positions=[list(range(width, width + q))] * len(ids),
        positions_fed=True, cache_width=width, mask_kind="2d", mask=masks, batch_size=len(ids),
        query_len=q, argmax=argmax,
    )  # fmt: skip


def packed(tokens: list[int], keys: int, attends: list[set[int]], positions: list[int], argmax, cache: int):
    """One packed row over a shared cache: query token i attends the key slots `attends[i]` (the
    cache's `cache` slots, then the query's own)."""
    t = len(tokens)
    mask = torch.tensor([[[k in attends[i] for k in range(keys)] for i in range(t)]])
    return CallRecord(
        role="target", rows=None, input_ids=torch.tensor([tokens]), positions=torch.tensor([positions]),
        positions_fed=True, cache_width=cache, mask_kind="4d", mask=mask, batch_size=1, query_len=t,
        argmax=torch.tensor([argmax]), packed=True,
    )  # fmt: skip


def test_a_cacheless_loop_that_starts_fresh_prompts_reads_them_as_new_sequences() -> None:
    """A loop without a cache (each call re-feeds whole contexts) decodes A = [5, 6, 7] and B =
    [8, 9, 10] one step, then a second batch of the same size on fresh prompts C = [11, 12, 13] and
    D = [14, 15, 16]: no row continues A or B, so every row starts a sequence (a second decode), not
    a batch kept in its order whose rows were fed the wrong context. A and B end with their one
    step's argmax (40, 41), C and D with theirs (42, 43)."""
    full = [[1, 1, 1], [1, 1, 1]]
    calls = [
        padded([[5, 6, 7], [8, 9, 10]], 0, full, [[99, 99, 40], [99, 99, 41]]),
        padded([[11, 12, 13], [14, 15, 16]], 0, full, [[99, 99, 42], [99, 99, 43]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]
    assert [c.rows for c in calls] == [(0, 1), (2, 3)]
    assert tokens_of(emits) == {0: [40], 1: [41], 2: [42], 3: [43]}


def test_in_a_shared_cache_the_slots_a_row_attends_name_its_sequence() -> None:
    """A packed engine over one shared cache: A = [5, 6, 7] (slots 0-2) and B = [8, 9, 10] (slots
    3-5) prefilled in one row, both choosing 40 (slots 6 and 7 next call), then 50, then 60. In the
    third call B's token comes first (slot 8, attending B's 3, 4, 5, 7) and A's second (slot 9: 0,
    1, 2, 6); in the fourth A's first again (slot 10) and B's second (slot 11). Each row's chain
    fits A and B alike (same length, same token): the slots each attends, as its sequence's last row
    held them, say which it is, so the rows are B's then A's, then A's then B's, and A ends 40, 50,
    60, 70, B 40, 50, 60, 71 (the last step's argmax, read as greedy). Read by place, or by the
    slots of another call's row, a row would be the other sequence, attending the other's slots."""
    calls = [
        packed([5, 6, 7, 8, 9, 10], 6, [{0}, {0, 1}, {0, 1, 2}, {3}, {3, 4}, {3, 4, 5}], [0, 1, 2, 0, 1, 2],
               [99, 99, 40, 99, 99, 40], 0),
        packed([40, 40], 8, [{0, 1, 2, 6}, {3, 4, 5, 7}], [3, 3], [50, 50], 6),
        packed([50, 50], 10, [{3, 4, 5, 7, 8}, {0, 1, 2, 6, 9}], [4, 4], [60, 60], 8),
        packed([60, 60], 12, [{0, 1, 2, 6, 9, 10}, {3, 4, 5, 7, 8, 11}], [5, 5], [70, 71], 10),
    ]  # fmt: skip
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert [c.rows for c in calls] == [(0, 1), (0, 1), (1, 0), (0, 1)]
    assert tokens_of(emits) == {0: [40, 50, 60, 70], 1: [40, 50, 60, 71]}


def test_a_batch_of_unchanged_size_that_no_assignment_explains_keeps_its_order() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10], prefilled but their last token, then stepped greedily
    (argmax 40 and 41). In the last call A's row is fed 77, which no step committed (a bug: a wrong
    token written back), B's row its 41. No sequence's chain or token fits the first row, and the
    batch kept its size: the rows keep their order, so 77 is read as A's gain (where the check then
    flags it), never as a row that continues nothing. The last steps read as greedy: 50 and 51."""
    one = [[1, 1, 1], [1, 1, 1]]
    calls = [
        padded([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [[99, 98], [99, 98]]),  # 98: never fed next
        padded([[7], [10]], 2, one, [[40], [41]]),
        padded([[77], [41]], 3, [[1] * 4, [1] * 4], [[50], [51]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert calls[2].rows == (0, 1)
    assert tokens_of(emits) == {0: [77, 50], 1: [41, 51]}


def test_a_row_fed_its_last_token_again_has_finished_there() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10], prefilled but their last token, then stepped: 40 and 41,
    then 50 and 51. In the last call A's row is fed 40 again (its step's pending token, the cache
    grown by one: the engine keeps computing a finished row) while B's row is fed 51. A finished at
    [40]: its last step is not read as greedy (no 50), and that is its own budget (one token) while
    B decoded on (under its own: its last emit ends by length)."""
    calls = [
        padded([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [[99, 98], [99, 98]]),  # 98: never fed next
        padded([[7], [10]], 2, [[1] * 3, [1] * 3], [[40], [41]]),
        padded([[40], [41]], 3, [[1] * 4, [1] * 4], [[50], [51]]),
        padded([[40], [51]], 4, [[1] * 5, [1] * 5], [[50], [61]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert [c.rows for c in calls[2:]] == [(0, 1), (0, 1)]
    assert tokens_of(emits) == {0: [40], 1: [41, 51, 61]}
    assert [e.finish_reason for e in emits if e.seq_id == 1][-1] == "length"


def test_a_prompt_prefilled_in_chunks_is_read_as_its_prompt() -> None:
    """No draft model, one sequence: [5, 6, 7, 8, 9, 10] prefilled in three chunks of two ([5, 6]
    without a cache, then [7, 8], then [9, 10]), whose last chunk's argmax 40 is fed next. Each chunk
    after the first is read as the prompt's next part (its first token pending, the rest like
    drafts that were all kept, fed no greedy pick), so the prompt is all six tokens and the output
    40, then the last step's argmax 50 (read as greedy). Read as steps, 8 and 9 would be generated
    tokens of a three-token prompt."""
    calls = [
        padded([[5, 6]], 0, [[1, 1]], [[99, 98]]),  # 98: never fed next
        padded([[7, 8]], 2, [[1] * 4], [[97, 96]]),
        padded([[9, 10]], 4, [[1] * 6], [[95, 40]]),
        padded([[40]], 6, [[1] * 7], [[50]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7, 8, 9, 10]]
    assert tokens_of(emits) == {0: [40, 50]}


def test_follow_rows_names_each_row_by_its_declared_prompt() -> None:
    """The API's inferred producer: A = [5, 6, 7] and B = [8, 9, 10] followed as above, declared in
    the other order, so each row is named by the declared index of its prompt (A's rows 1, B's 0).
    Declared prompts that none of the followed ones start with make every call unreadable; and
    where reading stopped (a last call of one row, fed 77, which continues nothing), that call is
    unreadable for the reason the reading gave."""
    from specviz.watch.infer.follow import follow_rows

    def run(declared: list[list[int]], last: CallRecord) -> list[CallRecord]:
        calls = [
            padded([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [[99, 98], [99, 98]]),
            padded([[7], [10]], 2, [[1] * 3, [1] * 3], [[40], [41]]),
            last,
        ]
        for c in calls:
            c.materialize()
        follow_rows(calls, declared, EOS, [])
        return calls

    calls = run([[8, 9, 10], [5, 6, 7]], padded([[41], [40]], 3, [[1] * 4, [1] * 4], [[51], [50]]))
    assert [c.rows for c in calls] == [(1, 0), (1, 0), (0, 1)]
    assert all(c.unreadable is None for c in calls)
    calls = run([[8, 9, 10], [5, 6, 8]], padded([[40], [41]], 3, [[1] * 4, [1] * 4], [[50], [51]]))
    assert all("of target call" in (c.unreadable or "") for c in calls)
    assert all("starts with no declared prompt" in (c.unreadable or "") for c in calls)
    calls = run([[5, 6, 7], [8, 9, 10]], padded([[77]], 3, [[1] * 4], [[50]]))
    assert [c.rows for c in calls] == [(0, 1), (0, 1), None]
    assert calls[0].unreadable is None and calls[1].unreadable is None
    assert calls[2].unreadable.startswith("row 0 of target call 2 continues no sequence read so far: 1 target calls")


def whole(role: str, ids: list[int], argmax: list[int]) -> CallRecord:
    """One row re-fed its whole context (no cache), by the target or by a draft model."""
    q = len(ids)
    return CallRecord(
        role=role, rows=None, input_ids=[ids], positions=[list(range(q))], positions_fed=True, cache_width=0,
        mask_kind="2d", mask=[[1] * q], batch_size=1, query_len=q, argmax=[argmax],
    )  # fmt: skip


def test_a_recompute_loop_with_a_draft_model_is_read_from_what_it_re_fed() -> None:
    """A loop without a cache that re-feeds each row's whole context, with a draft model (its calls
    between the target's): A = [5, 6, 7] commits 40, then 77 where the target chose 50 (a bug), and
    re-feeds it. The row shows what was committed, 77, read as such so the check flags it; never
    the target's choice 50 (the reading of a run with no draft model, whose re-fed rows only the
    greedy rule tells from their drafts), which would call the wrong output clean."""

    calls = [
        whole("target", [5, 6, 7], [99, 99, 40]),
        whole("draft", [5, 6, 7, 40], [99, 99, 99, 88]),
        whole("target", [5, 6, 7, 40], [99, 99, 99, 50]),
        whole("draft", [5, 6, 7, 40, 77], [99, 99, 99, 99, 88]),
        whole("target", [5, 6, 7, 40, 77], [99, 99, 99, 99, 60]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7]]
    assert tokens_of(emits) == {0: [40, 77, 60]}


def test_a_first_call_that_verified_drafts_was_a_step() -> None:
    """The same loop, its draft model proposing before the target's first call: A = [5, 6, 7] is
    verified with the draft 88 in its first target call, whose argmax at 7 is 40 (88 refused); the
    next call re-feeds [5, 6, 7, 40] and the draft's 89, which the target accepts, then 60. The
    first call verified a draft, so it was a step: the prompt is [5, 6, 7] and the output 40, 89,
    60, although the argmax at its last slot (99) is not what was fed next (a prefill's sign)."""
    calls = [
        whole("draft", [5, 6, 7], [99, 99, 88]),
        whole("target", [5, 6, 7, 88], [99, 99, 40, 99]),
        whole("draft", [5, 6, 7, 40], [99, 99, 99, 89]),
        whole("target", [5, 6, 7, 40, 89], [99, 99, 99, 89, 60]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7]]
    assert tokens_of(emits) == {0: [40, 89, 60]}


def test_in_a_shared_cache_a_finished_row_fed_again_is_read_by_its_slots_as_finished() -> None:
    """The packed engine: A = [5, 6, 7] (slots 0-2) chooses 40, then 40 again (its argmax repeats
    the token); B = [8, 9, 10] (slots 3-5) chooses 41, then 51, then 61. In the last call B's row
    comes first (slot 8) and A's second: fed 40 again over A's prompt slots only (slot 9; its 40 of
    slot 6 not attended: the cache did not grow). A attends its own slots, and its chain reads the
    row as fed its last token again: A finished at [40] (its own budget, one token), never read as
    growing by its token alone (40 again, and again at its close), and B decoded on to 61."""
    calls = [
        packed([5, 6, 7, 8, 9, 10], 6, [{0}, {0, 1}, {0, 1, 2}, {3}, {3, 4}, {3, 4, 5}], [0, 1, 2, 0, 1, 2],
               [99, 99, 40, 99, 99, 41], 0),
        packed([40, 41], 8, [{0, 1, 2, 6}, {3, 4, 5, 7}], [3, 3], [40, 51], 6),
        packed([51, 40], 10, [{3, 4, 5, 7, 8}, {0, 1, 2, 9}], [4, 3], [61, 40], 8),
    ]  # fmt: skip
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert [c.rows for c in calls] == [(0, 1), (0, 1), (1, 0)]
    assert tokens_of(emits) == {0: [40], 1: [41, 51, 61]}
    assert [(e.seq_id, e.finish_reason) for e in emits if e.finish_reason] == [(0, "length"), (1, "length")]


def test_rows_fed_no_mask_are_followed_by_their_tokens() -> None:
    """An engine that passes no attention mask (the watch counts no context): A = [5, 6, 7] and
    B = [8, 9, 10] prefilled but their last token, then fed it, then their argmax (40, 41). With no
    context to count, each newcomer is continued by its row (its first call's reading stays open
    until the next), and each later row by the greedy continuation: the prompts are whole and the
    steps gained 40, 41, then the last step's argmax 50, 51 (read as greedy)."""

    def unmasked(ids: list[list[int]], width: int, argmax) -> CallRecord:
        call = padded(ids, width, [[1]] * len(ids), argmax)
        call.mask_kind, call.mask = "none", None
        return call

    calls = [
        unmasked([[5, 6], [8, 9]], 0, [[99, 98], [99, 98]]),  # 98: never fed next
        unmasked([[7], [10]], 2, [[40], [41]]),
        unmasked([[40], [41]], 3, [[50], [51]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert [c.rows for c in calls] == [(0, 1), (0, 1), (0, 1)]
    assert tokens_of(emits) == {0: [40, 50], 1: [41, 51]}


def test_rows_that_fit_two_sequences_alike_stop_reading_even_in_a_batch_of_unchanged_size() -> None:
    """A = [5, 6, 7], B = [8, 9, 10] and C = [11, 12, 13], prefilled but their last token; A's and
    B's steps both choose 40, C's EOS (1), which C is fed next and ends on while A and B are fed 40
    and both choose 50. Next call, same three rows: the first two are fed 50 at the same position
    over the same history, so each fits A and B alike, and C's finished row holds a newcomer,
    [20, 21], prefilled from nothing (rows kept in their order do not explain the call). Which of
    the first two rows is A is not told: reading stops there, with the reason, never a guess."""
    calls = [
        padded([[5, 6], [8, 9], [11, 12]], 0, [[1, 1]] * 3, [[99, 98]] * 3),  # 98: never fed next
        padded([[7], [10], [13]], 2, [[1] * 3] * 3, [[40], [40], [1]]),
        padded([[40], [40], [1]], 3, [[1] * 4] * 3, [[50], [50], [0]]),
        padded([[50, 0], [50, 0], [20, 21]], 4, [[1] * 5 + [0]] * 2 + [[0] * 4 + [1, 1]], [[60, 0], [61, 0], [0, 70]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert prompts[:3] == [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    assert len(notes) == 1 and "fit more than one sequence each" in notes[0] and "call 3" in notes[0]


def test_rows_that_fit_two_sequences_alike_keep_their_order_where_another_row_continues_nothing() -> None:
    """As above, but the third row is C's, fed 77, which C's step (choosing 42) did not commit: no
    assignment explains every row, so the order kept is the reading (as in a batch no assignment
    explains) and the wrong token is C's, where the check flags it. A and B gain 40 each, then
    their last steps' argmax (50, 51, read as greedy)."""
    three = [[1] * 3] * 3
    calls = [
        padded([[5, 6], [8, 9], [11, 12]], 0, [[1, 1]] * 3, [[99, 98]] * 3),  # 98: never fed next
        padded([[7], [10], [13]], 2, three, [[40], [40], [42]]),
        padded([[40], [40], [77]], 3, [[1] * 4] * 3, [[50], [51], [52]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert calls[2].rows == (0, 1, 2)
    assert tokens_of(emits) == {0: [40, 50], 1: [40, 51], 2: [77, 52]}


def test_a_live_sequence_moved_into_a_finished_rows_place_is_read_there() -> None:
    """A = [5, 6, 7], B = [8, 9, 10] and C = [11, 12, 13], prefilled but their last token, step
    together; A chooses EOS (1), is fed it and ends there, while B gains 41 and C 42. The engine
    then compacts: C moves into A's row 0 (fed C's next token, 52), B stays in row 1 (51), row 2
    is padding. Row 0 is not A fed again but C, moved: C gains 52, then its last step's argmax 62
    (read as greedy), B 51 then 61. Read in its old order, row 0 would be A's idle row and C would
    have ended at 42."""
    calls = [
        padded([[5, 6], [8, 9], [11, 12]], 0, [[1, 1]] * 3, [[99, 98]] * 3),  # 98: never fed next
        padded([[7], [10], [13]], 2, [[1] * 3] * 3, [[1], [41], [42]]),
        padded([[1], [41], [42]], 3, [[1] * 4] * 3, [[60], [51], [52]]),
        padded([[52], [51], [0]], 4, [[1] * 5, [1] * 5, [0] * 5], [[62], [61], [0]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    assert calls[3].rows[:2] == (2, 1)
    assert tokens_of(emits) == {0: [1], 1: [41, 51, 61], 2: [42, 52, 62]}


def test_a_row_that_sat_out_a_call_and_is_fed_its_last_token_again_is_idle_as_the_batch_grows() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10] step once (40, 41). In call 2 A's row is fed nothing (all
    padding) while B's is fed 41: A has left the batch, its last step read as greedy ([40]). In
    call 3 a newcomer C = [11, 12, 13] joins (three rows), A's row is fed 40 again over A's three
    slots (the engine computing a finished row), B's is fed 51. A's row is idle there: A's context
    already holds its last step, so it is not added twice (which read the row as continuing
    nothing, and reading stopped at call 3)."""
    calls = [
        padded([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [[99, 98], [99, 98]]),
        padded([[7], [10]], 2, [[1] * 3, [1] * 3], [[40], [41]]),
        padded([[0], [41]], 3, [[0] * 4, [1] * 4], [[0], [51]]),
        padded(
            [[0, 0, 40], [0, 0, 51], [11, 12, 13]],
            4,
            [[1, 1, 1, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0, 1], [0, 0, 0, 0, 1, 1, 1]],
            [[0, 0, 50], [0, 0, 61], [99, 98, 70]],
        ),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    assert calls[3].rows[1:] == (1, 2) and calls[3].rows[0] < 0  # row 0 idle
    assert tokens_of(emits) == {0: [40], 1: [41, 51, 61], 2: [70]}


def test_a_row_that_held_no_sequence_is_read_afresh_when_a_newcomer_fills_it() -> None:
    """A = [5, 6] and B = [8, 9] (their prefill chose 7 and 10) step in a batch grown to three rows,
    the third all padding: it holds no sequence. In the next call (three rows again) a newcomer
    C = [11, 12, 13] is prefilled there while A and B are fed 40 and 41: the rows did not all keep
    a sequence, so they are read afresh and C is new (not some earlier sequence by a negative row id)."""
    calls = [
        padded([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [[99, 7], [99, 10]]),
        padded([[7], [10], [0]], 2, [[1, 1, 1], [1, 1, 1], [0, 0, 0]], [[40], [41], [0]]),
        padded(
            [[0, 0, 40], [0, 0, 41], [11, 12, 13]],
            3,
            [[1, 1, 1, 0, 0, 1], [1, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1]],
            [[0, 0, 50], [0, 0, 51], [99, 98, 70]],
        ),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    assert not notes, notes
    assert prompts == [[5, 6], [8, 9], [11, 12, 13]]
    assert [c.rows for c in calls[1:]] == [(0, 1, -3), (0, 1, 2)]
    assert tokens_of(emits) == {0: [7, 40, 50], 1: [10, 41, 51], 2: [70]}
