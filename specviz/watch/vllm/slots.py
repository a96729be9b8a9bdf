"""Which KV each physical slot holds, as vLLM's own slot_mapping wrote it (docs/vllm.md section 3): per
slot, the last write as (position fed, prefix hash of the writer's tokens up to it). A slot a request
attends at index j must hold (j, its own prefix up to j); the target and the draft model keep one each."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, groupby
from operator import itemgetter

import numpy as np

ROOT = 0  # the prefix hash before the first token


def prefixes(tokens: Sequence[int], start: int | None = ROOT) -> list[int]:
    """The prefix hash after each token (deterministic within a run); a chain on None matches no ROOT chain."""
    return list(accumulate(tokens, lambda prefix, token: hash((prefix, token)), initial=start))[1:]


def block_slots(block_table: Sequence[int], length: int, block_size: int) -> list[int]:
    """The physical slots of logical indices 0..length-1 under a block table."""
    j = np.arange(length)
    return (np.asarray(block_table, dtype=np.int64)[j // block_size] * block_size + j % block_size).tolist()


class SlotLedger:
    """The last write to each slot of one cache (target or draft)."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[int, int]] = {}  # slot -> (position fed, prefix hash up to the token written)
        self.log: list[int] = []  # slots in the order written: what changed since a reader's last check
        # reader -> its last check: the log's length then, the stable reads and hashes it judged, slot ->
        # index of those reads, and the indices that failed
        self._checked: dict[str, tuple[int, list[int], list[int], dict[int, int], set[int]]] = {}

    def write(self, slots: Sequence[int], positions: Sequence[int], base: int | None, tokens: Sequence[int]) -> None:
        """One segment's writes, chained on `base` (None: unknown, matches nothing). A padding slot (-1) is
        written too: no block table names it, so no read ever judges it."""
        self.held.update(zip(slots, zip(positions, prefixes(tokens, base))))
        self.log.extend(slots)  # a slot logged and not written is judged again alike

    def adopt(self, slots: Sequence[int], hashes: Sequence[int]) -> None:
        """Slots of vLLM's prefix cache no write seen by the watch filled: taken as the cache's hash says."""
        for j, (slot, prefix) in enumerate(zip(slots, hashes)):
            self.held.setdefault(slot, (j, prefix))
        self.log.extend(slots)  # a slot held keeps its write: logged again, it is judged again alike

    def bad(self, reader: str, reads: list[int], hashes: list[int], stable: int) -> list[int]:
        """The indices j whose slot reads[j] does not hold (j, hashes[j]) (past `hashes`, all). A reader
        is judged again only where slots were written since its last check, or past its `stable` part."""
        m, fresh = min(len(reads), len(hashes)), (len(self.log), [], [], {}, set())  # never judged: nothing kept
        logged, kept_reads, kept_hashes, index, failed = self._checked.get(reader, fresh)
        if (reads[: len(kept_reads)], hashes[: len(kept_reads)]) != (kept_reads, kept_hashes):
            logged, kept_reads, kept_hashes, index, failed = fresh  # what it reads changed: nothing judged stands
        keep, stable = len(kept_reads), min(stable, m)
        changed = {index[slot] for slot in set(self.log[logged:]) & index.keys()}
        judged = [*changed, *range(keep, m)]
        bad = (failed - changed) | {j for j in judged if self.held.get(reads[j]) != (j, hashes[j])}
        index.update(zip(reads[keep:stable], range(keep, stable)))
        self._checked[reader] = (len(self.log), reads[:stable], hashes[:stable], index, {j for j in bad if j < stable})
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
