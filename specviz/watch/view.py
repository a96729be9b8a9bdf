"""A row's view: what one row of a materialized call feeds and attends, whatever mask it was fed.
`read_views` is the one place the watch reads a mask's kind; every reader (the step builder, the
tree readings, the command's inferrer) asks a row's `View`, one class per kind (docs/watch.md, "The
batch map"). A 4-D mask's query line not kept (`tensor_reads.QUERY_TAIL`) reads as unknown, never a guess."""

from __future__ import annotations

from itertools import compress, groupby, takewhile
from typing import Any

import numpy

Rle = list[list[int]]  # [[value, run length], ...]: canonical like the recorder's


def rle(values: list[int]) -> Rle:
    """[0, 0, 1, 1, 1] -> [[0, 2], [1, 3]]."""
    return [[int(value), len(list(run))] for value, run in groupby(values)]


def slots_on(line: Any) -> list[int]:
    """The indices a mask line (or any row of flags) has on: the slots it attends."""
    return numpy.flatnonzero(line).tolist()


class View:
    """A row whose mask cannot be read: its flags and cache; of what it attends, nothing (-1, None).
    Each kind's class reads: `before(slot)`, the slots query slot `slot` attends before itself;
    `mask_row`; `tree(first, n)`, the parents of the tree the n query slots from `first` show;
    `node_attends(pending, n)`, per tree node the nodes it attends; `tree_row(pending, parents)`,
    a tree row's mask_rle and context; `keys(slot)`, the [cache | query] columns slot `slot` attends."""

    def __init__(self, flags: list[int], cache: int) -> None:
        self.flags = flags  # [q] 1: a real query token (shared: readers never change it)
        self.cache = cache  # slots in the row's cache before the call
        # The last real slot (else the last).
        self.last = max(compress(range(len(flags)), flags), default=len(flags) - 1)

    @classmethod
    def read(cls, call: Any, row: int, flags: list[int]) -> View:
        """The view of a materialized call's row, its mask read as this class reads one."""
        return cls(flags, call.cache_width)

    def real_run(self) -> int:
        """Real query slots in the run ending at the last one (0: none is real)."""
        return len(list(takewhile(bool, reversed(self.flags[: self.last + 1]))))

    def attends_cache(self) -> bool:
        """Does the row attend any slot of its cache (a newcomer prefilled over a shared one does not)?"""
        return self.cache > 0 and self._sees_cache()

    def _sees_cache(self) -> bool:  # given a cache, where the mask does not say otherwise
        return True

    def before(self, slot: int) -> int:
        return -1

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        """(mask_rle: the pending token's view of its context, then per query slot from it whether it
        attends its own key; attended context slots; the query block causal, None: not said)."""
        return [], -1, None

    def refed_root(self, first: int) -> bool:
        """Does the query token at `first` see nothing before it (re-fed context, no cache)?"""
        return False

    def _unread(self, *_: Any) -> Any:
        return None

    tree = node_attends = tree_row = keys = _unread


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

    @classmethod
    def read(cls, call: Any, row: int, flags: list[int]) -> View:
        values, q = [int(v) for v in call.mask[row]], call.query_len
        return cls(values[len(values) - q :] if len(values) >= q else flags, call.cache_width, values)

    def before(self, slot: int) -> int:
        return int(sum(self.values[: len(self.values) - len(self.flags) + slot]))

    def _sees_cache(self) -> bool:
        return any(self.values[: len(self.values) - len(self.flags)])

    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        start = len(self.values) - len(self.flags) + pending
        return rle(self.values[: start + q]), int(sum(self.values[:start])), None


def _kept(method: Any) -> Any:
    """A 4-D reading from query slot `first` on; where that slot's line was not kept, the unknown
    `View`'s (the kept lines are the query's last, so a later slot's line was kept too)."""
    unknown = getattr(View, method.__name__)

    def read(self: _Lines, first: int, *rest: Any) -> Any:
        return method(self, first, *rest) if first >= self.unkept else unknown(self, first, *rest)

    return read


class _Lines(View):
    """A 4-D mask's kept lines: `lines[i]` is the last len(lines) query slots' i-th, over the keys."""

    def __init__(self, flags: list[int], cache: int, lines: list[list[bool]], width: int = 0) -> None:
        super().__init__(flags, cache)
        self.lines, self.width = lines, width  # width: the call's cache width (a `Keyed` query's first key)
        self.unkept = len(flags) - len(lines)  # the query slots before the first kept line

    @classmethod
    def read(cls, call: Any, row: int, flags: list[int]) -> View:
        return cls(flags, call.cache_width, call.mask[row], call.cache_width)

    def _lines_from(self, first: int, n: int = 1) -> list[list[bool]]:
        """The mask lines of the n query slots from `first` (kept: `_kept`)."""
        return self.lines[first - self.unkept : first - self.unkept + n]

    def refed_root(self, first: int) -> bool:
        return self.before(first) <= 0  # nothing attended before it but itself

    @_kept
    def node_attends(self, pending: int, n: int) -> list[list[int]] | None:
        return [slots_on(line) for line in self._node_block(pending, n)]

    @_kept
    def tree_row(self, pending: int, parents: list[int]) -> tuple[Rle, int] | None:
        return self._tree_read(pending, parents)[:2]  # its causality aside: a tree is no chain


class Keyed(_Lines):
    """A 4-D mask whose keys are [cache | query]: query slot t's own key is column `width + t`."""

    @_kept
    def before(self, slot: int) -> int:
        return int(sum(self._lines_from(slot)[0][: self.width + slot]))

    def _sees_cache(self) -> bool:
        return any(any(line[: self.width]) for line in self.lines)

    @_kept
    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        lines, context = self._lines_from(pending, q), self.width + pending
        view = [int(v) for v in lines[0][:context]]
        diagonal = [int(lines[i][context + i]) for i in range(q)]
        # Causal: every later query slot sees that context plus exactly the query slots up to itself.
        causal = all(
            [int(v) for v in line[: context + q]] == view + [1] * (i + 1) + [0] * (q - i - 1)
            for i, line in enumerate(lines)
        )
        return rle(view + diagonal), sum(view), causal

    def _node_block(self, first: int, n: int) -> list[list[bool]]:
        """block[i][j]: query node i (slot first + i) attends node j."""
        start = self.width + first
        return [[bool(v) for v in line[start : start + n]] for line in self._lines_from(first, n)]

    @_kept
    def tree(self, first: int, n: int) -> list[int] | None:
        return parents_of_block(self._node_block(first, n))

    def _tree_read(self, pending: int, parents: list[int]) -> tuple[Rle, int, bool | None]:
        return self.mask_row(pending, len(parents))  # the chain's reading over the nodes

    @_kept
    def keys(self, slot: int) -> list[int] | None:
        return self._lines_from(slot)[0]


class Slotted(_Lines):
    """A 4-D mask over a static or in-place cache's slots (or a packed segment's): read by the sets
    of slots each query slot attends, not where its own key sits."""

    @_kept
    def before(self, slot: int) -> int:
        return int(sum(self._lines_from(slot)[0])) - 1  # every slot it attends but its own

    def _sees_cache(self) -> bool:  # a recycled static slot's prefill attends only its own tokens
        return self.before(self.last) + 1 != sum(self.flags[: self.last + 1])

    def _sets(self, first: int, n: int) -> list[frozenset[int]]:
        return [frozenset(slots_on(line)) for line in self._lines_from(first, n)]

    @_kept
    def mask_row(self, pending: int, q: int) -> tuple[Rle, int, bool | None]:
        return self._tree_read(pending, list(range(-1, q - 1)))  # the query as a chain

    @_kept
    def tree(self, first: int, n: int) -> list[int] | None:
        return parents_of_sets(self._sets(first, n))

    def _node_block(self, pending: int, n: int) -> list[list[bool]]:
        sets = self._sets(pending, n)
        return [[node <= seen for node in sets] for seen in sets]  # node j seen: all its slots are

    def _tree_read(self, pending: int, parents: list[int]) -> tuple[Rle, int, bool | None]:
        """By counts: the root attends its context and itself, each node its parent's slots and its own."""
        sets = self._sets(pending, len(parents))
        return by_counts(len(sets[0]), [one_more(sets[p], sets[i]) for i, p in enumerate(parents[1:], 1)])


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
    """A row read by counts, in `mask_row`'s form: the pending slot attends `first` slots (its
    context and itself), each later slot grows the one before by one (its own) or not, flagged."""
    context = max(first - 1, 0)
    diagonal = [int(first > 0), *map(int, grows)]
    return rle([1] * context + diagonal), context, all(diagonal)


def parents_of_block(block: list[list[bool]]) -> list[int] | None:
    """The tree an N x N query block shows (block[i][j]: node i attends node j): node 0 sees no
    other node, node i itself plus exactly its parent's view; None when it shows none. Then each
    node's set holds its ancestors and itself: the tree its slot sets show (`parents_of_sets`)."""
    views = [frozenset(slots_on(line)) for line in block]
    rooted = views[:1] == [{0}] and all(i in view for i, view in enumerate(views))
    return parents_of_sets(views) if rooted else None


def parents_of_sets(sets: list[frozenset[int]]) -> list[int] | None:
    """The tree the nodes' attended slot sets show: node i's parent is the one earlier node whose
    set is i's minus one slot (i's own); None when a node has no such node, or several."""
    if not sets or not sets[0]:
        return None
    parents = [-1]
    for i in range(1, len(sets)):
        found = slots_on([one_more(earlier, sets[i]) for earlier in sets[:i]])
        if len(found) != 1:
            return None
        parents.append(found[0])
    return parents


def one_more(parent: frozenset[int], node: frozenset[int]) -> bool:
    """A node's slots are its parent's plus exactly one (its own)."""
    return parent < node and len(node) == len(parent) + 1


# The reader of each mask kind, by whether a mask was kept (`none`: none fed); any other: `View`.
_KINDS, _UNKEPT = {"2d": Padded, "4d": Keyed, "4d-slots": Slotted}, {"none": Unmasked}


def read_views(call: Any) -> list[View]:
    """One view per row of a materialized call (`batchmap.apply` gives a packed call's segments theirs)."""
    kind, live = call.mask_kind, call.query_live
    reader = (_KINDS if call.mask is not None else _UNKEPT).get(kind, View)
    views: list[View] = []
    for row in range(call.batch_size):
        flags = [1] * call.query_len
        if live is not None and (any(live[row]) or kind in ("4d", "4d-slots")):  # a 4-D row none live feeds nothing
            flags = [int(v) for v in live[row]]
        views.append(reader.read(call, row, flags))
    return views
