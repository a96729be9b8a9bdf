"""The batch map's producers: which sequence each segment of a forward call holds (`read_map`: what
was declared, else a packed 1 x T call cut by its own arguments, else one sequence per padded row;
docs/watch.md, "Who says it"). A call none can read is unreadable, and the trace says why. `apply`
turns a packed call into one right-padded row per sequence, so packed, paged and padded engines read alike."""

from __future__ import annotations

from itertools import accumulate, zip_longest
from typing import Any

import numpy

from specviz.watch.map import BatchMap, Segment  # noqa: F401  (the one type; re-exported)
from specviz.watch.view import Counted, Slotted, View, slots_on

_NOT_PACKED = "its one row is not packed (no cu_seq_lens_q, block-diagonal mask or restarting positions)"
Span = tuple[int, int, int, tuple[int, int] | None]  # (row, start, length, own keys in a shared KV)


def read_map(call: Any) -> BatchMap:
    """The call's map, with the declared sequences, drafts and chunks (`_said`); unreadable (a value)
    where a target's one row holds fewer sequences than it declares, or its layout cannot be cut."""
    try:
        source, spans = _layout(call)
        count, declared = len(spans), call.rows or ()  # None: not declared
        if call.role == "target" and len(declared) > count and call.batch_size == 1:
            holds = f"its {source} holds {count}" if source != "padded" else _NOT_PACKED
            raise ValueError(f"rows declares {len(declared)} sequences; {holds}")
        ids, said = _said(call.rows, count, None), _said(call.declared, count, (None, False))
        segments = tuple(Segment(s, *span, drafts=d, chunk=c) for s, span, (d, c) in zip(ids, spans, said))
        return BatchMap(segments, source)
    except ValueError as why:  # a layout no producer can cut, or a segment `Segment` refuses
        return BatchMap.unread("declared", str(why))


def _said(values: Any, count: int, default: Any) -> tuple[Any, ...]:
    """What was declared of each of `count` sequences; `default` each where said of another number."""
    return tuple(values) if values is not None and len(values) == count else (default,) * count


def _layout(call: Any) -> tuple[str, list[Span]]:
    """(source, spans): a packed call cut by the first of its arguments that cuts it, else one per row."""
    if not call.packed:  # B == 1 (`hooks`): a packed call's one row
        return _padded(call)
    if call.query_lens is not None:
        return "declared", _from_lengths(call.query_lens, call.query_len, [])
    if call.cu_q is not None:
        # Each sequence's keys are paired with its queries before the empty ones are dropped, so a
        # sequence with no query token in the middle does not shift the keys of those after it.
        cu_k = call.cu_k or ()
        queries, keys = list(zip(call.cu_q, call.cu_q[1:])), list(zip(cu_k, cu_k[1:]))
        fed = [(b - a, key) for (a, b), key in zip_longest(queries, keys[: len(queries)]) if b > a]
        return "cu_seq_lens", _from_lengths([n for n, _ in fed], call.query_len, [key for _, key in fed])
    if call.lines is not None:
        source, cut = "block-mask", _block_segments(call.lines, call.positions[0], call.tree_nodes)
    elif call.mask_kind == "none" and call.cache_width == 0 and call.positions_fed:  # transformers' rule
        starts = numpy.flatnonzero(numpy.diff(call.positions[0]) != 1) + 1  # a position not the one before + 1
        source, cut = "positions", _back_to_back(starts.tolist(), len(call.positions[0]))
    else:
        return _padded(call)
    return (source, [(0, *span) for span in cut]) if len(cut) > 1 else _padded(call)


def _padded(call: Any) -> tuple[str, list[Span]]:
    return "padded", [(r, 0, call.query_len, None) for r in range(call.batch_size)]


def _from_lengths(lengths: list[int], width: int, keys: list[tuple[int, int] | None]) -> list[Span]:
    """Back-to-back sequences of these lengths, with their own keys where `keys` has them."""
    if sum(lengths) > width or any(n <= 0 for n in lengths):
        raise ValueError(f"query lengths {lengths} do not fit the call's {width} query tokens")
    return [(0, *span) for span in zip_longest([0, *accumulate(lengths)][:-1], lengths, keys)]


def block_cuts(lines: list[tuple[int, bool, bool, bool]], positions: list[int]) -> list[int]:
    """Where a block-diagonal mask (`tensor_reads.line_summary`) starts a sequence: a token that drops
    a slot the one before it attended and does not follow its position or does not continue it (a
    sliding window drops old slots, with positions that follow; a tree's sibling: `packed_nodes`)."""
    # A plain scan of the summary's tuples: turning them back into arrays cost more than the scan
    # (20 us against 1 us for 40 tokens, 189 against 57 for 1,000; it runs twice per packed call).
    return [
        t
        for t, (_, dropped, continues, _) in enumerate(lines[1:], 1)
        if dropped and (positions[t] - positions[t - 1] != 1 or not continues)
    ]


def _block_segments(lines: Any, positions: list[int], nodes: Any = ()) -> list[tuple[int, int, None]]:
    """A block-diagonal mask's sequences: cut at each of its `block_cuts` that is no tree node."""
    return _back_to_back(sorted(set(block_cuts(lines, positions)).difference(nodes)), len(lines))


def _back_to_back(cuts: list[int], end: int) -> list[tuple[int, int, None]]:
    """(start, length, no own keys) of the sequences from column 0 to `end`, one more at each cut."""
    bounds = [0, *cuts, end]
    return [(a, b - a, None) for a, b in zip(bounds, bounds[1:])]


def apply(call: Any, bmap: BatchMap, seen: Any = None) -> bool:
    """Rewrite a materialized packed call as one right-padded row per segment, in place (True: it
    was packed), each with its view (`_view`); `seen` is the [T, keys] boolean mask of a call that
    packs trees (`tree.packed_nodes`), whose rows keep the slots each token attends."""
    call.rows = tuple(s.seq for s in bmap.segments) if all(s.seq is not None for s in bmap.segments) else None
    if not bmap.packed:
        return False
    segments, width = bmap.segments, max(s.length for s in bmap.segments)
    lines = _key_lines(call, bmap)

    def padded(rows: list[list[Any]], pad: Any) -> list[list[Any]]:  # each segment's columns, right-padded
        return [rows[s.row][s.start : s.start + s.length] + [pad] * (width - s.length) for s in segments]

    call.input_ids, call.positions = padded(call.input_ids, 0), padded(call.positions, 0)
    call.argmax = padded(spread_argmax(call), None)
    call.views = [_view(s, width, lines, seen) for s in segments]
    call.mask, call.query_live, call.batch_size, call.query_len = None, None, len(segments), width
    call.cache_width = max((v.cache for v in call.views), default=0)
    call.logit_slots, call.lines = None, None
    call.segments = [(s.row, s.start, s.length) for s in segments]  # raw columns, for `headinput`
    return True


def _view(s: Segment, width: int, lines: Any, seen: Any) -> View:
    """A segment's view, right-padded to `width`: nothing without lines (its mask checks are
    skipped), else the slots each token attends where it packs trees (`seen`), else its counts."""
    flags, pad = [1] * s.length + [0] * (width - s.length), width - s.length
    if lines is None:
        return View(flags, 0)
    cache = max(lines[s.start][0] - 1, 0)
    if seen is not None:  # only the key slots some token of it attends, in order
        block = seen[s.start : s.start + s.length]
        used = slots_on(block.any(0))
        return Slotted(flags, cache, block[:, used].tolist() + [[False] * len(used)] * pad)
    return Counted(flags, cache, lines[s.start : s.start + s.length] + [(0, False)] * pad)


def spread_argmax(call: Any) -> list[list[int | None]]:
    """[B, q]: each row's argmax at the query columns it was kept at (its last ones, or
    `logits_to_keep`'s), None at the others; all None where no argmax was kept."""
    q, spread = call.query_len, [[None] * call.query_len for _ in range(call.batch_size)]
    for row, kept in zip(spread, call.argmax or ()):
        columns = range(q - len(kept), q) if call.logit_slots is None else call.logit_slots
        for c, token in zip(columns, kept):
            row[c] = token
    return spread


def _key_lines(call: Any, bmap: BatchMap) -> list[tuple[int, bool]] | None:
    """Per query column of row 0: (key slots it attends, exactly one more than the column before),
    from the mask's summary, else causal over each sequence's own keys (None: not said)."""
    if call.lines is not None:
        return [(count, one_more) for count, _, _, one_more in call.lines]
    spans = [s.keys for s in bmap.segments]
    if any(k is None for k in spans):
        if call.mask_kind != "none" or call.cache_width:
            return None
        spans = [(s.start, s.start + s.length) for s in bmap.segments]
    lines: list[tuple[int, bool]] = [(0, False)] * call.query_len
    for s, (lo, hi) in zip(bmap.segments, spans):
        for t in range(s.length):
            lines[s.start + t] = (hi - s.length + t + 1 - lo, t > 0)  # causal: up to its own key
    return lines
