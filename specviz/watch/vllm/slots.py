"""Which KV each physical slot holds, as vLLM's own slot_mapping wrote it.

A request's token at logical index j lives in slot `block_table[j // block_size] * block_size +
j % block_size`. Its KV is a function of the tokens 0..j and of the position it was fed at, so the
ledger keeps, per slot, the last declared write as (position fed, prefix hash chain of the writer's
tokens up to it). A slot a request attends at index j must hold (j, its own prefix up to j): a
write into another request's block, a wrong position, a rejected draft left behind, a slot never
written each shows as one that does not. Requests sharing a prefix share blocks in vLLM's prefix
cache, and the same (position, prefix) is the same KV: no false alarm. The target and the draft
model have separate caches over the same block numbering: one ledger each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

Entry = tuple[int, int]  # (position fed, prefix hash of the tokens up to the one written)
ROOT = 0  # the prefix hash before the first token


def chain(prefix: int, token: int) -> int:
    """The prefix hash after `token` (tuple hashing of ints is deterministic within a run)."""
    return hash((prefix, token))


def prefixes(tokens: Sequence[int], start: int = ROOT) -> list[int]:
    """The prefix hash after each token."""
    out = []
    for token in tokens:
        start = chain(start, token)
        out.append(start)
    return out


def block_slots(block_table: Sequence[int], length: int, block_size: int, known: Sequence[int] = ()) -> list[int]:
    """The physical slots of logical indices 0..length-1; `known`: the first ones, computed before
    under the same table."""
    start = min(len(known), length)
    return [*known[:start], *(block_table[j // block_size] * block_size + j % block_size for j in range(start, length))]


@dataclass
class _Checked:
    """One reader's last check: the write log's length then, the reads and hashes it judged (the
    stable part), slot -> index of those reads, and the indices that failed."""

    logged: int
    reads: list[int]
    hashes: list[int]
    index: dict[int, int]
    bad: set[int]


class SlotLedger:
    """The last write to each slot of one cache (target or draft)."""

    def __init__(self) -> None:
        self.held: dict[int, Entry] = {}
        self.log: list[int] = []  # slots in the order written: what changed since a reader's last check
        self._checked: dict[str, _Checked] = {}

    def write(self, slots: Sequence[int], positions: Sequence[int], base: int | None, tokens: Sequence[int]) -> None:
        """One segment's writes, its tokens chained on `base` (the writer's prefix before them; None:
        unknown, and what it writes then matches nothing). Slot -1 is vLLM's padding: no write."""
        hashes = prefixes(tokens, base) if base is not None else [None] * len(tokens)
        for slot, position, prefix in zip(slots, positions, hashes):
            if slot >= 0:
                self.held[slot] = (position, prefix)
                self.log.append(slot)

    def adopt(self, slots: Sequence[int], hashes: Sequence[int]) -> None:
        """Slots a request found in vLLM's prefix cache that no write seen by the watch filled (they
        were written before it began): taken as the cache's hash says, holding that prefix."""
        for j, (slot, prefix) in enumerate(zip(slots, hashes)):
            if slot not in self.held:
                self.held[slot] = (j, prefix)
                self.log.append(slot)

    def bad(self, reader: str, reads: list[int], hashes: list[int], stable: int) -> list[int]:
        """The logical indices j < len(reads) whose slot reads[j] does not hold (j, hashes[j]); past
        the end of `hashes` every index fails. A reader (a request) is judged again only where
        something changed since its last check (slots written since, indices past what it judged);
        its first `stable` hashes (committed tokens) are kept for next time, the rest judged afresh."""
        m = min(len(reads), len(hashes))
        fresh = _Checked(len(self.log), [], [], {}, set())  # a reader never judged: nothing to keep
        last = self._checked.get(reader, fresh)
        if reads[: len(last.reads)] != last.reads or hashes[: len(last.hashes)] != last.hashes:
            last = fresh  # what it reads changed: nothing judged before still stands
        keep = len(last.reads)
        # Judged again: the kept indices whose slot was written since, and every index past them.
        changed = {last.index[slot] for slot in set(self.log[last.logged :]) if slot in last.index}
        judged = [*changed, *range(keep, m)]
        bad = (last.bad - changed) | {j for j in judged if self.held.get(reads[j]) != (j, hashes[j])}
        stable = min(stable, m)
        index = last.index
        for j in range(keep, stable):
            index[reads[j]] = j
        self._checked[reader] = _Checked(
            len(self.log), reads[:stable], hashes[:stable], index, {j for j in bad if j < stable}
        )
        return sorted(bad) + list(range(m, len(reads)))


def runs(length: int, bad: Sequence[int]) -> list[list[int]]:
    """Run-length code of `length` flags, all 1 but the indices `bad`: [[value, count], ...]."""
    flags = [1] * length
    for j in bad:
        flags[j] = 0
    return [[value, len(list(group))] for value, group in groupby(flags)]


def join_runs(first: list[list[int]], second: list[list[int]]) -> list[list[int]]:
    """Two run-length codes, one after the other (equal values meeting at the join make one run)."""
    return [[value, sum(c for _, c in group)] for value, group in groupby(first + second, key=itemgetter(0))]
