"""A packed engine's shared cache, undeclared: where a leaked slot of a neighbour could mislead the
reading. The cut of a block-diagonal mask (`batchmap`, from `hooks.line_summary`) and which
sequence a row holds (`follow.Follower`, the slots it mostly attends) on small hand-made masks;
the zoo engines with the leak bugs are `test_zoo_production.py` (`kv_leak*`)."""

from __future__ import annotations

import torch
from tiny import make_pair
from zoo import packed

import specviz
from specviz.analysis.check import check_trace
from specviz.watch.batchmap import read_map
from specviz.watch.hooks import CallRecord
from specviz.watch.tensor_reads import line_summary, segment_slots, shared_slots


def cut(block: list[list[bool]], positions: list[int]) -> list[tuple[int, int]]:
    """The segments (start, length) a 1 x T call with this [T, keys] mask is cut into."""
    t = len(block)
    call = CallRecord(
        role="target", rows=None, input_ids=[list(range(t))], positions=[positions], positions_fed=True,
        cache_width=0, mask_kind="4d", mask=None, batch_size=1, query_len=t, packed=True,
        lines=line_summary(torch.tensor(block)),
    )  # fmt: skip
    return [(s.start, s.length) for s in read_map(call).segments]


def test_a_leaked_slot_does_not_glue_two_sequences() -> None:
    """Keys 0-2: sequence A's cache, keys 3-4: B's; the query is A's token (key 5) then B's two
    (keys 6, 7). B's first token also attends A's slot 0 (a leak) and its position follows A's: it
    still starts a sequence, for it gains its whole context, not only its own key. A sliding window
    (one old slot dropped, one own key gained, positions following) stays one sequence."""
    a = [j in (0, 1, 2, 5) for j in range(8)]
    b0 = [j in (0, 3, 4, 6) for j in range(8)]  # the leak: slot 0
    b1 = [j in (0, 3, 4, 6, 7) for j in range(8)]
    assert cut([a, b0, b1], [3, 4, 5]) == [(0, 1), (1, 2)]
    assert cut([a, [j in (3, 4, 6) for j in range(8)], [j in (3, 4, 6, 7) for j in range(8)]], [3, 4, 5]) == [
        (0, 1),
        (1, 2),
    ]
    window = [[t <= j <= t + 2 for j in range(6)] for t in range(4)]
    assert cut(window, [2, 3, 4, 5]) == [(0, 4)]


def test_held_slots_count_what_two_rows_share() -> None:
    """Each sequence's first and last query token's slots; a later call's wider keys still line
    up slot by slot with an earlier call's."""
    block = torch.tensor([[j in (0, 1, 5) for j in range(8)], [j in (0, 3, 4, 6) for j in range(8)]])
    (a_first, a_last), (b_first, _) = segment_slots(block, [(0, 0, 1), (0, 1, 1)])
    assert shared_slots(a_first, a_last) == 3 and shared_slots(b_first, a_last) == 1
    wider = torch.tensor([[j in (0, 1, 5, 9) for j in range(10)]])
    assert shared_slots(segment_slots(wider, [(0, 0, 1)])[0][0], a_last) == 3


def test_a_run_whose_prompts_differ_from_the_declared_ones_is_unreadable() -> None:
    """The packed engine, undeclared, run on prompts one of which the watch was told otherwise:
    the followed sequence that starts with no declared prompt makes the run unreadable from its
    first step, never clean and never a desync on what was not read."""
    pair = make_pair("llama")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21]]
    told = [list(p) for p in prompts]
    told[2] = [14, 15, 16, 18]
    with specviz.watch(pair.target, pair.draft, prompts=told, name="told-otherwise") as w:
        packed.generate(pair.target, pair.draft, prompts, [6, 4, 6, 5], w=w, late=0)
    report = check_trace(w.trace)
    assert report.verdict == "unreadable" and not report.violation_count
    assert report.unreadable["step"] == 0 and "starts with no declared prompt" in report.unreadable["why"]
