"""A row's view: what one row of a materialized call feeds and attends, whatever mask the engine
fed. The one place the watch reads a mask; every reader (the step builder, the tree readings, the
command's inferrer) asks a row's `View`, never the mask's kind.

A row's query is its `q` query slots; `flags[t]` is 1 where slot t holds a real token (0:
padding). What the mask says of each real slot is one of:
- `Unmasked` (no mask fed): every slot of its cache and of the query up to itself;
- `Padded` (a 2-D [B, W] mask over [cache | query]): the key columns it marks, up to the slot's own;
- `Keyed` (a 4-D mask whose keys are [cache | query]): the key columns each query line marks, its own
  key at `cache + t`, so the query block says which query slots see which (a tree);
- `Slotted` (a 4-D mask over a static or in-place cache's slots, or a packed call's segment): which
  slots each query line marks, but not which of them is its own;
- `Counted` (a packed call's segment whose mask is summarised, `batchmap.apply`): per slot, how many
  keys it attends and whether it attends exactly one more than the slot before;
- `View` itself where nothing can be read (a mask of a shape the hooks do not know).
Only the last query lines of a 4-D mask are kept (`tensor_reads.QUERY_TAIL`): a line not kept reads
as unknown (-1), never as a guess.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

Rle = list[list[int]]  # [[value, run length], ...]: canonical like the recorder's


def rle(values: list[int]) -> Rle:
    """[0, 0, 1, 1, 1] -> [[0, 2], [1, 3]]."""
    return [[int(value), len(list(run))] for value, run in groupby(values)]


def slots_on(line: Any) -> list[int]:
    """The indices a mask line (or any row of flags) has on: the slots it attends."""
    return [j for j, on in enumerate(line) if on]


class View:
    """A row whose mask cannot be read: its flags, its cache, nothing of what it attends."""

    def __init__(self, flags: list[int], cache: int) -> None:
        self.flags = flags  # [q] 1: a real query token (shared: readers never change it)
        self.cache = cache  # slots in the row's cache before the call
        # The row's last real query slot (the last one when none is).
        self.last = next((t for t in range(len(flags) - 1, -1, -1) if flags[t]), len(flags) - 1)

    def before(self, slot: int) -> int:
        """Slots the query token at `slot` attends before itself (-1: not read)."""
        return -1

    def attends_cache(self) -> bool:
        """Does the row attend any slot of the cache it was given? A sequence prefilled alone over a
        shared cache (a newcomer once every other request ended) is given it, attends none of it."""
        return self.cache > 0

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        """(mask_rle: the pending token's view of its context, then one flag per query slot from
        it: it attends its own key; attended context slots; the query block causal, None: not
        said). [], -1: not read."""
        return [], -1, None

    def tree(self, first: int, n: int) -> list[int] | None:
        """The parents of the tree the n query slots from `first` show (None: none, or not read)."""
        return None

    def refed_root(self, first: int) -> bool:
        """Does the query token at `first` see nothing before it (re-fed context, no cache)?"""
        return False

    def node_attends(self, pending: int, n: int) -> list[list[int]] | None:
        """Per tree node from `pending`: the nodes it attends (None: not read)."""
        return None

    def tree_row(self, pending: int, parents: list[int]) -> tuple[Rle, int] | None:
        """(mask_rle as the root's view of the context then one flag per node: it attends its own
        slot; attended context slots) of a tree row, None where not read."""
        return None

    def keys(self, slot: int) -> list[int] | None:
        """The [cache | query] key columns query slot `slot` attends, where the mask names them."""
        return None


class Unmasked(View):
    """No mask fed: every slot attends its cache and the query up to itself."""

    def before(self, slot: int) -> int:
        return self.cache + slot

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        context = self.cache + pending
        return [[1, context + q]], context, None


class Padded(View):
    """A 2-D mask over [cache | query]: `values` are the row's W columns, its query the last q."""

    def __init__(self, flags: list[int], cache: int, values: list[int]) -> None:
        super().__init__(flags, cache)
        self.values = values

    def _column(self, slot: int) -> int:
        return len(self.values) - len(self.flags) + slot

    def before(self, slot: int) -> int:
        return int(sum(self.values[: self._column(slot)]))

    def attends_cache(self) -> bool:
        return self.cache > 0 and any(self.values[: self._column(0)])

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        start = self._column(pending)
        return rle(self.values[: start + q]), int(sum(self.values[:start])), None


class _Lines(View):
    """A 4-D mask's kept lines: `lines[i]` is the last len(lines) query slots' i-th, over the keys."""

    def __init__(self, flags: list[int], cache: int, lines: list[list[bool]]) -> None:
        super().__init__(flags, cache)
        self.lines = lines

    def _line(self, slot: int) -> list[bool] | None:
        """The mask line of query slot `slot`; None where it was not kept."""
        t = slot - (len(self.flags) - len(self.lines))
        return self.lines[t] if 0 <= t < len(self.lines) else None

    def _lines_from(self, first: int, n: int) -> list[list[bool]] | None:
        """The mask lines of the n query slots from `first`; None where one was not kept."""
        lines = [self._line(first + i) for i in range(n)]
        return None if any(line is None for line in lines) else lines

    def _sets(self, first: int, n: int) -> list[frozenset[int]] | None:
        """The key slots each of the n query slots from `first` attends (None: a line not kept)."""
        lines = self._lines_from(first, n)
        return None if lines is None else [frozenset(slots_on(line)) for line in lines]


class Keyed(_Lines):
    """A 4-D mask whose keys are [cache | query]: query slot t's own key is column `width + t`."""

    def __init__(self, flags: list[int], cache: int, lines: list[list[bool]], width: int) -> None:
        super().__init__(flags, cache, lines)
        self.width = width  # the call's cache width: where the query's keys begin

    def before(self, slot: int) -> int:
        line = self._line(slot)
        return -1 if line is None else int(sum(line[: self.width + slot]))

    def attends_cache(self) -> bool:
        return self.cache > 0 and any(any(line[: self.width]) for line in self.lines)

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        """The pending query's view of the context, then the diagonal; causal if every later query
        slot of the row sees that same context plus exactly the query slots up to itself."""
        lines = self._lines_from(pending, q)
        if lines is None:
            return [], -1, None
        context, n = self.width + pending, q
        view = [int(v) for v in lines[0][:context]]
        diagonal = [int(lines[i][context + i]) for i in range(n)]
        causal = all(
            [int(v) for v in line[: context + n]] == view + [1] * (i + 1) + [0] * (n - i - 1)
            for i, line in enumerate(lines)
        )
        return rle(view + diagonal), sum(view), causal

    def _block(self, first: int, n: int) -> list[list[bool]] | None:
        """block[i][j]: query node i (slot first + i) attends node j."""
        start, lines = self.width + first, self._lines_from(first, n)
        return None if lines is None else [[bool(v) for v in line[start : start + n]] for line in lines]

    def tree(self, first: int, n: int) -> list[int] | None:
        block = self._block(first, n)
        return None if block is None else parents_of_block(block)

    def refed_root(self, first: int) -> bool:
        return not any(self._line(first)[: self.width + first])

    def node_attends(self, pending: int, n: int) -> list[list[int]] | None:
        block = self._block(pending, n)
        return None if block is None else [slots_on(line) for line in block]

    def tree_row(self, pending: int, parents: list[int]) -> tuple[Rle, int] | None:
        """The chain's reading over the nodes (the root's view, then the diagonal), its causality
        aside: a tree is not causal. None for a declared tree past the kept lines."""
        runs, context, _ = self.mask_row(pending, len(parents))
        return None if context < 0 else (runs, context)

    def keys(self, slot: int) -> list[int] | None:
        return self._line(slot)


class Slotted(_Lines):
    """A 4-D mask whose keys are a static or in-place cache's slots (or a packed segment's): what
    each query slot attends is read, not where its own key sits, so a row is read by its sets: a
    later slot grows the one before it when it attends all it did and one slot more."""

    def before(self, slot: int) -> int:
        line = self._line(slot)
        return -1 if line is None else int(sum(line)) - 1  # every slot it attends but its own

    def attends_cache(self) -> bool:
        """A recycled static slot's prefill attends only its own tokens."""
        attended = sum(self.flags[: self.last + 1])
        return self.cache > 0 and self.before(self.last) + 1 != attended

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        sets = self._sets(pending, q)
        if sets is None:
            return [], -1, None
        return by_counts(len(sets[0]), [one_more(before, now) for before, now in zip(sets, sets[1:])])

    def tree(self, first: int, n: int) -> list[int] | None:
        sets = self._sets(first, n)
        return None if sets is None else parents_of_sets(sets)

    def refed_root(self, first: int) -> bool:
        return len(slots_on(self._line(first))) <= 1

    def node_attends(self, pending: int, n: int) -> list[list[int]] | None:
        """Node j seen: every slot it attends, its own included."""
        sets = self._sets(pending, n)
        return None if sets is None else [[j for j in range(n) if sets[j] <= seen] for seen in sets]

    def tree_row(self, pending: int, parents: list[int]) -> tuple[Rle, int] | None:
        """Read by counts: the root attends its context and itself, each node its parent's slots
        plus one (its own)."""
        sets = self._sets(pending, len(parents))
        if sets is None:  # a declared tree past the kept lines
            return None
        grows = [one_more(sets[parents[i]], sets[i]) for i in range(1, len(parents))]
        runs, context, _ = by_counts(len(sets[0]), grows)
        return runs, context


class Counted(View):
    """A packed call's segment read by its mask's summary: `counts[t]` is (key slots query slot t
    attends, it attends exactly one more than the slot before)."""

    def __init__(self, flags: list[int], cache: int, counts: list[tuple[int, bool]]) -> None:
        super().__init__(flags, cache)
        self.counts = counts

    def before(self, slot: int) -> int:
        return self.counts[slot][0] - 1

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        counts = self.counts[pending : pending + q]
        return by_counts(counts[0][0], [grows for _, grows in counts[1:]])


def by_counts(first: int, grows: list[bool]) -> tuple[Rle, int, bool | None]:
    """A row read by counts: the pending slot attends `first` slots (its context and itself), each
    later slot grows the one before it (one slot more: its own) or not. Returned in the canonical
    form (context, then one flag per query slot), so the checks read it like any other row: a stale
    or missing slot changes a count, and is flagged."""
    context = max(first - 1, 0)
    diagonal = [int(first > 0), *map(int, grows)]
    return rle([1] * context + diagonal), context, all(diagonal)


# ----------------------------------------------------------------------------- trees from a mask


def parents_of_block(block: list[list[bool]]) -> list[int] | None:
    """The tree an N x N query block shows (block[i][j]: node i attends node j): node 0 sees no
    other node, node i sees itself plus exactly its parent's view; None when it shows none."""
    views = [frozenset(slots_on(line)) for line in block]
    if not views or views[0] != {0}:
        return None
    parents = [-1]
    for i in range(1, len(views)):
        parent = max(views[i] - {i}, default=-1)  # the latest other node it sees (-1: none)
        if not 0 <= parent < i or views[i] != views[parent] | {i}:  # its own view is its parent's plus itself
            return None
        parents.append(parent)
    return parents


def parents_of_sets(sets: list[frozenset[int]]) -> list[int] | None:
    """The tree the nodes' attended slot sets show: node i's parent is the one earlier node whose
    set is i's minus one slot (i's own); None when a node has no such node, or several."""
    if not sets or not sets[0]:
        return None
    parents = [-1]
    for i in range(1, len(sets)):
        found = [p for p in range(i) if one_more(sets[p], sets[i])]
        if len(found) != 1:
            return None
        parents.append(found[0])
    return parents


def one_more(parent: frozenset[int], node: frozenset[int]) -> bool:
    """A node's slots are its parent's plus exactly one (its own)."""
    return parent < node and len(node) == len(parent) + 1


# ----------------------------------------------------------------------------- one view per row


def read_views(call: Any) -> list[View]:
    """One view per row of a materialized call that is not packed (a packed call's segments get
    theirs from `batchmap.apply`). The one place a captured mask's kind is read."""
    q, kind, mask, live = call.query_len, call.mask_kind, call.mask, call.query_live
    views: list[View] = []
    for row in range(call.batch_size):
        flags, cache = [1] * q, call.cache_of(row)
        if live is not None and (any(live[row]) or kind in ("4d", "4d-slots")):
            flags = [int(v) for v in live[row]]  # a 4-D row with none live feeds nothing
        if kind == "2d" and mask is not None:
            values = [int(v) for v in mask[row]]
            views.append(Padded(values[len(values) - q :] if len(values) >= q else flags, cache, values))
        elif kind == "4d" and mask is not None:
            views.append(Keyed(flags, cache, mask[row], call.cache_width))
        elif kind == "4d-slots" and mask is not None:
            views.append(Slotted(flags, cache, mask[row]))
        else:
            views.append(Unmasked(flags, cache) if kind == "none" else View(flags, cache))
    return views
