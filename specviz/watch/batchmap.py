"""The batch map: who is where in one forward call, and the producers that read it.

Every captured call gets one `BatchMap` at close, from the first producer that can say it:
1. **declared**: the engine said so through the API (`w.batch(...)`, or `w.rows(...)` for a
   padded batch), or transformers' continuous batching manager named the request in each place
   (`paged.PagedCapture`);
2. **read from the forward's own arguments** (layout adapters): a padded [B, T] batch is one
   sequence per row (2-D or 4-D mask, padding on either side); a packed 1 x T call is cut into its
   sequences by `cu_seq_lens_q` (flash-attention varlen, transformers' `PagedAttentionArgs`), else
   by its block-diagonal 4-D mask (a query token that does not attend what the token before it
   attended starts another sequence, unless it is a tree node: `tree.packed_nodes`), else, with
   no mask and no cache, by its `position_ids`
   restarting (transformers' own packed-sequence rule, `find_packed_sequence_indices`);
3. **inferred**: nothing was declared and no adapter applies (a padded batch without `w.rows`,
   `specviz watch --`): the sequence in each row is left to `infer.follow.Follower` (the command) or to
   the default order (row r holds sequence r).

A call that no producer can read (declared rows that fit no reading of its layout, say) is
*unreadable*: the steps stop before it and the trace says why (`infer_steps`).

`apply` turns a packed call into one padded row per sequence (right-padded, a mask of the key
slots each query token attends), so the step builder and the checks read packed, paged and padded
engines alike, and the app draws one sequence per grid row.
"""

from __future__ import annotations

from itertools import accumulate, zip_longest
from typing import Any

from specviz.watch.map import BatchMap, Segment  # noqa: F401  (the one type; re-exported)
from specviz.watch.view import Counted, Slotted, View


class Unreadable(Exception):
    """No producer can say which sequence a row or token of this call belongs to."""


# ----------------------------------------------------------------------------- producers


def read_map(call: Any) -> BatchMap:
    """The call's map from the first producer that can read it (see the module docstring), with
    the declared sequence ids, drafts and chunks. Unreadable (`BatchMap.unread`, a value) when a
    target call's declaration names more sequences than any reading of its layout holds, or
    declares what its layout cannot hold."""
    try:
        source, spans = _layout(call)
        ids = _declared_ids(call, len(spans), source)
        said = call.declared
        if said is None or len(said) != len(spans):  # said of other sequences: not of these
            said = [(None, False)] * len(spans)
        return BatchMap(
            tuple(Segment(s, *span, drafts=d, chunk=c) for s, span, (d, c) in zip(ids, spans, said)),
            call.source or source,
        )
    except (Unreadable, ValueError) as why:
        return BatchMap.unread(call.source or "declared", str(why))


def _declared_ids(call: Any, count: int, source: str) -> tuple[int | None, ...]:
    """The declared sequence of each of the call's `count` sequences; None where undeclared. A
    declaration of another length is the default order (a padded batch declared before it changed,
    as before maps), except where it names several sequences for what reads as one row."""
    declared = call.rows or ()  # None: not declared
    if len(declared) == count:
        return tuple(declared)
    packed = source != "padded"
    if call.role == "target" and len(declared) > count and (packed or count == 1):
        layout = (
            f"its {source} holds {count}"
            if packed
            else "its one row is not packed (no cu_seq_lens_q, block-diagonal mask or restarting positions)"
        )
        raise Unreadable(f"rows declares {len(declared)} sequences; {layout}")
    return (None,) * count


Span = tuple[int, int, int, tuple[int, int] | None]  # (row, start, length, own keys in a shared KV)


def _layout(call: Any) -> tuple[str, list[Span]]:
    """(source, spans) of the call's sequences: a packed 1 x T call's, cut as the module docstring
    says, else ("padded") one sequence per row, as is a packed call that nothing cuts."""
    if call.batch_size != 1 or not call.packed:
        return _padded(call)
    if call.query_lens is not None:  # declared with w.batch(..., query_lens=...)
        return "declared", _from_lengths(call.query_lens, call.query_len, [])
    if call.cu_q is not None:
        # Each sequence's keys are paired with its queries before the empty ones are dropped, so a
        # sequence with no query token in the middle does not shift the keys of those after it.
        queries, keys = list(zip(call.cu_q, call.cu_q[1:])), list(zip(call.cu_k or (), (call.cu_k or ())[1:]))
        fed = [(b - a, key) for (a, b), key in zip_longest(queries, keys[: len(queries)]) if b > a]
        return "cu_seq_lens", _from_lengths([n for n, _ in fed], call.query_len, [key for _, key in fed])
    if call.lines is not None:
        source, cut = "block-mask", _block_segments(call.lines, call.positions[0], call.tree_nodes or ())
    elif call.mask_kind == "none" and call.cache_width == 0 and call.positions_fed:
        source, cut = "positions", _position_segments(call.positions[0])
    else:
        source, cut = "padded", []
    return (source, [(0, *span) for span in cut]) if len(cut) > 1 else _padded(call)


def _padded(call: Any) -> tuple[str, list[Span]]:
    return "padded", [(r, 0, call.query_len, None) for r in range(call.batch_size)]


def _from_lengths(lengths: list[int], width: int, keys: list[tuple[int, int] | None]) -> list[Span]:
    """Back-to-back sequences of these lengths, each with its own [lo, hi) keys in a shared KV where
    `keys` (from cu_seq_lens_k) has them: fewer than the sequences, None for the rest."""
    if sum(lengths) > width or any(n <= 0 for n in lengths):
        raise Unreadable(f"query lengths {lengths} do not fit the call's {width} query tokens")
    starts = [0, *accumulate(lengths)][:-1]
    return [(0, *span) for span in zip_longest(starts, lengths, keys)]


def block_cut(lines: list[tuple[int, bool, bool, bool]], positions: list[int], t: int) -> bool:
    """Does query token t of a block-diagonal mask start a new sequence? When it drops a slot the
    token before it attended and its position does not follow that token's or it does not continue
    it (a sliding window drops old slots too, with positions that follow, and gains only its own
    key; a neighbour's first token gains its context, even where a slot is shared). A packed tree's
    sibling drops its predecessor's slot too: `tree.packed_nodes` names those, and they are no cut."""
    _, dropped, continues, _ = lines[t]
    return dropped and (positions[t] != positions[t - 1] + 1 or not continues)


def _block_segments(
    lines: list[tuple[int, bool, bool, bool]], positions: list[int], nodes: Any = ()
) -> list[tuple[int, int, None]]:
    """A block-diagonal mask's sequences: cut at each `block_cut` that is not a tree node (`nodes`)."""
    cuts = [t for t in range(1, len(lines)) if t not in nodes and block_cut(lines, positions, t)]
    return _back_to_back(cuts, len(lines))


def _position_segments(positions: list[int]) -> list[tuple[int, int, None]]:
    """transformers' packed-sequence rule: a position that is not the one before plus one starts a sequence."""
    return _back_to_back([t for t in range(1, len(positions)) if positions[t] != positions[t - 1] + 1], len(positions))


def _back_to_back(cuts: list[int], end: int) -> list[tuple[int, int, None]]:
    """(start, length, no own keys) of the sequences from column 0 to `end`, one more at each cut."""
    bounds = [0, *cuts, end]
    return [(a, b - a, None) for a, b in zip(bounds, bounds[1:])]


# ----------------------------------------------------------------------------- one row per sequence


def apply(call: Any, bmap: BatchMap, seen: Any = None) -> bool:
    """Rewrite a materialized packed call as one right-padded row per segment (in place); True
    when it did (the call was packed). Each row's `View` (`_views`) is read from the packed mask:
    per query slot, the key slots it attends and whether it attends exactly one more than the slot
    before (`Counted`: a slot of a neighbour attended, or one of its own missed, changes a count
    and is flagged); with `seen` (the [T, keys] boolean mask of a call that packs trees,
    `tree.packed_nodes`), the key slots each of its query slots attends (`Slotted`), so its tree can
    be read. Its context is what its first query token attends before itself.
    """
    call.rows = tuple(s.seq for s in bmap.segments) if all(s.seq is not None for s in bmap.segments) else None
    call.source = bmap.source
    if not bmap.packed:
        return False
    segments, width = bmap.segments, max(s.length for s in bmap.segments)
    argmax = argmax_by_column(call)
    lines = _key_lines(call, bmap)

    def padded(values: Any, pad: Any) -> list[list[Any]]:  # values(segment), right-padded to `width`
        return [values(s) + [pad] * (width - s.length) for s in segments]

    call.input_ids, call.positions, call.argmax = (
        padded(lambda s: call.input_ids[s.row][s.start : s.start + s.length], 0),
        padded(lambda s: call.positions[s.row][s.start : s.start + s.length], 0),
        padded(lambda s: [argmax.get((s.row, c)) for c in s.columns], None),
    )
    call.views = _views(segments, width, lines, seen)
    call.mask, call.query_live, contexts = None, None, [v.cache for v in call.views]
    call.batch_size, call.query_len, call.contexts = len(bmap.segments), width, contexts
    call.cache_width = max(contexts, default=0)
    call.logit_slots, call.lines = None, None
    call.segments = [(s.row, s.start, s.length) for s in bmap.segments]  # raw columns, for `headinput`
    return True


def _views(segments: tuple[Segment, ...], width: int, lines: Any, seen: Any) -> list[View]:
    """Each segment's view, right-padded to `width`: the key slots each of its tokens attends
    where it packs trees (`seen`, read as a static cache's slots), else its lines' counts, else
    nothing (the mask checks are skipped). Its cache: what its first token attends before itself."""
    views: list[View] = []
    for s in segments:
        flags = [1] * s.length + [0] * (width - s.length)
        cache = max(lines[s.start][0] - 1, 0) if lines is not None else 0
        if seen is not None:
            views.append(Slotted(flags, cache, _own_slots(seen, s, width)))
        elif lines is not None:
            views.append(Counted(flags, cache, lines[s.start : s.start + s.length] + [(0, False)] * (width - s.length)))
        else:
            views.append(View(flags, cache))
    return views


def _own_slots(seen: Any, segment: Segment, width: int) -> list[list[bool]]:
    """The segment's rows of a packed [T, keys] boolean mask, over only the key slots some token of
    it attends (in order: which slots each token sees, and which it shares with another, is all a
    `Slotted` view is read for), then all-False rows for its padding up to `width`."""
    block = seen[segment.start : segment.start + segment.length]
    used = block.any(0).nonzero().flatten()
    rows = block[:, used].tolist()
    return rows + [[False] * len(used)] * (width - segment.length)


def argmax_by_column(call: Any) -> dict[tuple[int, int], int]:
    """(row, query column) -> the argmax kept there (logits of the last columns, or of
    `logits_to_keep`'s columns)."""
    out: dict[tuple[int, int], int] = {}
    if call.argmax is None:
        return out
    q = call.query_len
    for r, kept in enumerate(call.argmax):
        columns = call.logit_slots if call.logit_slots is not None else range(q - len(kept), q)
        for c, token in zip(columns, kept):
            out[(r, c)] = token
    return out


def _key_lines(call: Any, bmap: BatchMap) -> list[tuple[int, bool]] | None:
    """Per query column of row 0: (key slots it attends, attends exactly one more than the column
    before). From the 4-D mask's summary, else what `cu_seq_lens_k` gives each sequence (its own
    keys, causal), else (no cache, cut by positions) its own segment, causal. None: nothing says
    (the mask checks are skipped)."""
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
