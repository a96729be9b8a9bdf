"""`watch.headinput`: which target hidden state a draft head was fed, as the verify row's
`head_source` [sequence, logical index], on hand-built calls (every expected value is read off
the calls by hand), and the tap's matching on a real tiny target (the oracle: its base model's
last hidden state, computed without the tap). The production engines are `test_zoo_production.py`
(`head`, `head_packed`)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from tiny import make_pair

from specviz.watch import headinput
from specviz.watch.headinput import MAX_CANDIDATES, HiddenTap, head_source, unfound_note
from specviz.watch.hooks import CallRecord
from specviz.watch.view import read_views


def at(row: int, column: int) -> tuple[int, ...]:
    """One match of a head row: (target row, query column) of the latest target call; where the
    tap keeps several calls (`headinput.HISTORY`), led by the call's age (0: the latest)."""
    return (0, row, column) if hasattr(headinput, "HISTORY") else (row, column)


def target_call(rows: tuple[int, ...], positions: list[list[int]], **fields) -> CallRecord:
    call = CallRecord(
        role="target", rows=rows, input_ids=[[0] * len(p) for p in positions], positions=positions,
        positions_fed=True, cache_width=0, mask_kind="none", mask=None, batch_size=len(positions),
        query_len=len(positions[0]),
    )  # fmt: skip
    for name, value in fields.items():
        setattr(call, name, value)
    call.views = read_views(call)  # as `materialize` reads them
    return call


def head_call(argmax: list[list[int]], fed: list[list[tuple[int, int]]] | None) -> CallRecord:
    call = target_call((), [[0]] * len(argmax), role="draft", drafter=True, argmax=argmax, head_fed=fed)
    call.rows = None
    return call


# The target call before the head: sequences 5 and 7, positions 3..5 and 6..8 (3 query tokens each).
SOURCE = target_call((5, 7), [[3, 4, 5], [6, 7, 8]])


def source_of(head: CallRecord, row: int, drafts: list[int], seq_id: int, committed: int, before=SOURCE):
    calls = [before, head, target_call((5, 7), [[6, 7, 8], [9, 10, 11]])]
    return head_source(calls, 2, [1], row, drafts, seq_id, committed)


def test_the_expected_source_is_named_when_the_head_was_fed_it() -> None:
    """Row 0 (sequence 5, 7 tokens committed): its head input is the hidden state at logical index
    5 (committed - 2, the slot that predicted its pending token): (row 0, column 2) of the source."""
    head = head_call([[40], [41]], [[at(0, 2)], [at(1, 2)]])
    assert source_of(head, 0, [40, 9], 5, 7) == [5, 5]
    assert source_of(head, 1, [41], 7, 10) == [7, 8]


def test_another_rows_state_is_named_as_such() -> None:
    """Row 0 fed row 1's state (the zoo's head_row bug): the source names sequence 7, index 8, not
    the expected one; several candidates (equal vectors) keep the expected one when it is among them."""
    head = head_call([[40], [41]], [[at(1, 2)], [at(0, 2)]])
    assert source_of(head, 0, [40], 5, 7) == [7, 8]
    tied = head_call([[40], [41]], [[at(1, 2), at(0, 2)], [at(1, 2)]])
    assert source_of(tied, 0, [40], 5, 7) == [5, 5]
    assert source_of(tied, 0, [40], 5, 8) == [7, 8]  # expected [5, 6] is not among them: the first


def test_no_source_where_nothing_can_be_told() -> None:
    head = head_call([[40], [41]], [[at(0, 2)], [at(1, 2)]])
    assert source_of(head, 0, [], 5, 7) is None  # no drafts: the head served nothing
    assert head_source([SOURCE, head, SOURCE], 2, [], 0, [40], 5, 7) is None  # no head call
    assert source_of(head_call([[40], [41]], None), 0, [40], 5, 7) is None  # not compared
    assert source_of(head_call([[40], [41]], [[], [at(1, 2)]]), 0, [40], 5, 7) is None  # matched nothing
    assert source_of(head, 0, [42], 5, 7) is None  # no head row proposed the row's first draft
    assert head_source([head, SOURCE], 1, [0], 0, [40], 5, 7) is None  # no target call before the head
    beyond = head_call([[40], [41]], [[at(0, 5)], [at(2, 0)]])  # places outside the source call
    assert source_of(beyond, 0, [40], 5, 7) is None and source_of(beyond, 1, [41], 7, 10) is None
    assert source_of(head_call([[40]], [[at(0, 2)], [at(1, 2)]]), 0, [40], 5, 7) is None  # argmax per row missing


def test_a_head_of_other_rows_is_read_by_the_token_it_proposed() -> None:
    """A head batch of another size (only the rows still drafting): the one row that proposed the
    verify row's first draft served it; two rows proposing that same token tell nothing. A head
    batch of the verify's own size whose row proposed something else is not searched for another
    row: a token that happens to match is no reading (a Medusa-shaped head's last column once drew
    a false head-input violation that way, tests/watch/test_zoo_medusa.py)."""
    one = head_call([[40]], [[at(0, 2)]])
    assert source_of(one, 0, [40], 5, 7) == [5, 5]
    three = head_call([[41], [40], [42]], [[at(1, 2)], [at(0, 2)], [at(1, 1)]])
    assert source_of(three, 0, [40], 5, 7) == [5, 5]
    ambiguous = head_call([[40], [40], [40]], [[at(0, 2)], [at(1, 2)], [at(0, 1)]])
    assert source_of(ambiguous, 1, [40], 7, 10) is None
    reversed_head = head_call([[41], [40]], [[at(1, 2)], [at(0, 2)]])
    assert source_of(reversed_head, 0, [40], 5, 7) is None
    # In the verify's own order (and batch), each row served itself, even where rows proposed alike.
    alike = head_call([[40], [40]], [[at(0, 2)], [at(1, 2)]])
    assert source_of(alike, 0, [40], 5, 7) == [5, 5] and source_of(alike, 1, [40], 7, 10) == [7, 8]
    # A head call fed two slots whose logits were kept at both proposed from its last one.
    wide = head_call([[11, 40], [12, 41]], [[at(0, 2)], [at(1, 2)]])
    wide.query_len = 2
    assert source_of(wide, 1, [41], 7, 10) == [7, 8]
    # A Medusa-shaped call (one slot fed, a logits column per head) proposed all its columns.
    medusa = head_call([[40, 9], [41, 8]], [[at(0, 2)], [at(1, 2)]])
    assert source_of(medusa, 1, [41, 8], 7, 10) == [7, 8] and source_of(medusa, 0, [9], 5, 7) is None


def test_a_packed_source_is_read_through_its_segments() -> None:
    """The source call was packed (1 x 7: sequence 5 in columns 0-2, then a padding column, then
    sequence 7 in columns 4-6) and unpacked into two rows; the head was fed raw (row, column)s."""
    packed = target_call((5, 7), [[3, 4, 5], [6, 7, 8]], segments=[(0, 0, 3), (0, 4, 3)])
    head = head_call([[40], [41]], [[at(0, 2)], [at(0, 6)]])
    assert source_of(head, 0, [40], 5, 7, before=packed) == [5, 5]
    assert source_of(head, 1, [41], 7, 10, before=packed) == [7, 8]
    padding = head_call([[40], [41]], [[at(0, 3)], [at(0, 6)]])  # column 3 is nobody's
    assert source_of(padding, 0, [40], 5, 7, before=packed) is None


def test_unfound_note_counts_the_drafting_rows_left_unchecked() -> None:
    def row(drafts, source):
        return SimpleNamespace(draft_tokens=drafts, head_source=source)

    steps = [
        SimpleNamespace(step=0, rows=[row([], None), row([4], [0, 3])]),
        SimpleNamespace(step=1, rows=[row([5, 6], None), row([7], [1, 4])]),
        SimpleNamespace(step=2, rows=[row([8], None)]),
    ]
    (note,) = unfound_note(steps)
    assert note.startswith("draft head input unreadable for 2 of 4 drafting rows (first at step 1)")
    assert unfound_note(steps[:1]) == [] and unfound_note([]) == []


def test_tap_reads_the_vector_fed_however_the_head_takes_it() -> None:
    """Positional or keyword, [B, H] or [B, T, H] (its last column), capped at four equal rows
    (MAX_CANDIDATES); no floating tensor of the hidden width fed: None (not compared)."""
    target = make_pair("llama").target
    ids = torch.tensor([[5, 9, 14]] * 6 + [[7, 8, 21]])  # six equal rows: four are named
    hidden = target.model(input_ids=ids).last_hidden_state  # the oracle, without the tap
    tap = HiddenTap(target)
    try:
        target.lm_head(hidden)  # a head sharing the LM head, before any target call: not kept
        assert tap.match_rows({"hidden_states": hidden[:, -1]}, ()) is None  # no target call yet
        tap.start(ids.shape[1])
        target(input_ids=ids)
        tap.end()
        last = len(ids) - 1
        wanted = [[at(last, 1)], [at(r, 2) for r in range(4)]]
        assert MAX_CANDIDATES == 4
        fed = torch.stack([hidden[last, 1], hidden[0, 2]])
        assert tap.match_rows({}, (fed,)) == wanted
        assert tap.match_rows({"features": fed[:, None]}, ()) == wanted
        assert tap.match_rows({"hidden_states": torch.cat([fed[:, None], fed[:, None] + 3], 1)}, ()) == [[], []]
        assert tap.match_rows({"input_ids": ids}, ()) is None
        assert tap.match_rows({"hidden_states": fed, "use_cache": True, "steps": 2}, ()) == wanted  # other keywords
        # 1% off is another vector, not a copy (within 1e-4 relative, RTOL)
        assert tap.match_rows({"hidden_states": fed * 1.01}, ()) == [[], []]
        assert tap.match_rows({"hidden_states": fed * (1 + 2e-5)}, ()) == wanted
        assert tap.match_rows({"hidden_states": torch.zeros(2, fed.shape[-1] + 1)}, ()) is None
    finally:
        tap.remove()
    tap.start(ids.shape[1])  # removed: a later call leaves nothing
    target(input_ids=ids)
    assert tap.last is None


def test_a_head_drafting_one_token_a_step_has_its_sources_read() -> None:
    """The zoo's head engine with k = 1 (one head call per step, as an MTP-1 head): the one head
    call right before each verify is the step's proposal; every drafting row's source is its own
    sequence's hidden state at its last cached token, and the run (batch-1 greedy) checks clean."""
    from zoo import head, shapes

    import specviz
    from specviz.analysis.check import check_trace

    pair = make_pair("llama")
    drafter = head.DraftHead(pair.target)
    prompts, budgets = [[5, 6, 7, 8], [11, 12, 13], [20, 21]], [6, 4, 5]
    with specviz.watch(pair.target, drafter=drafter, prompts=prompts) as w:
        outs, _ = head.generate(pair.target, drafter, prompts, budgets, k=1, w=w)
    assert outs == shapes.reference(pair.target, prompts, budgets)
    drafting = [row for step in w.trace.steps for row in step.rows if row.draft_tokens]
    assert drafting and all(len(row.draft_tokens) == 1 for row in drafting)
    assert all(row.head_source == [row.seq_id, row.committed_before - 2] for row in drafting)
    report = check_trace(w.trace)
    assert report.verdict == "clean" and not report.violation_count
