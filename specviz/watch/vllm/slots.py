"""Which KV each physical slot holds, as vLLM's own slot_mapping wrote it.

A paged engine keeps a request's KV in the blocks of its block table: the token at logical index j
lives in slot `block_table[j // block_size] * block_size + j % block_size`. The KV at index j is a
function of the tokens 0..j and of the position j it was fed at, so the ledger keeps, per slot,
the last write the runner declared as (position fed, prefix), the prefix being a hash chain of
the writer's tokens up to that one. A slot the request attends at index j must hold (j, its own
prefix up to j): a write into another request's block, a token fed at the wrong position, a
rejected draft left behind, a slot never written, each shows as a slot that does not. Requests
sharing a prefix share blocks in vLLM's prefix cache, and the same (position, prefix) is the same
KV, so that is no false alarm. The target and the draft model have separate caches over the same
block numbering: one ledger each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def block_slots(block_table: Sequence[int], length: int, block_size: int, known: list[int] | None = None) -> list[int]:
    """The physical slots of logical indices 0..length-1 (the reads of a request of that length).
    `known`: the slots computed last time for the same table, extended rather than recomputed."""
    start = len(known) if known is not None and len(known) <= length else 0
    head = known[:start] if start else []
    return head + [block_table[j // block_size] * block_size + j % block_size for j in range(start, length)]


@dataclass
class _Checked:
    """What one reader's last check saw: the ledger's write log length, the reads and hashes it
    judged (its stable part), the slot -> index of those reads, and the indices that failed."""

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
        the end of `hashes` (the reader has no such token) every index fails.
        A reader (a request, in this cache) is judged again only where something changed since its
        last check: slots written since, and indices past what it had judged; its first `stable`
        hashes (committed tokens) are kept for next time, the rest (drafts) judged afresh."""
        m = min(len(reads), len(hashes))
        last = self._checked.get(reader)
        keep = 0
        if last is not None and reads[: len(last.reads)] == last.reads and hashes[: len(last.hashes)] == last.hashes:
            keep = len(last.reads)
        if keep:
            bad = {j for j in last.bad if j < keep}
            for slot in set(self.log[last.logged :]):
                j = last.index.get(slot)
                if j is not None:
                    bad.discard(j)
                    if self.held.get(slot) != (j, hashes[j]):
                        bad.add(j)
            index = last.index
        else:
            bad, index = set(), {}
        for j in range(keep, m):
            if self.held.get(reads[j]) != (j, hashes[j]):
                bad.add(j)
        stable = min(stable, m)
        for j in range(keep, stable):
            index[reads[j]] = j
        self._checked[reader] = _Checked(
            len(self.log), reads[:stable], hashes[:stable], index, {j for j in bad if j < stable}
        )
        return sorted(bad) + list(range(m, len(reads)))


def runs(length: int, bad: Sequence[int]) -> list[list[int]]:
    """Run-length code of `length` flags, all 1 but the sorted indices `bad`: [[value, count], ...]."""
    out: list[list[int]] = []
    at = 0
    for j in bad:
        if j > at:
            out.append([1, j - at])
        if out and out[-1][0] == 0:
            out[-1][1] += 1
        else:
            out.append([0, 1])
        at = j + 1
    if length > at:
        out.append([1, length - at])
    return out


def join_runs(first: list[list[int]], second: list[list[int]]) -> list[list[int]]:
    """Two run-length codes, one after the other."""
    if first and second and first[-1][0] == second[0][0]:
        return first[:-1] + [[first[-1][0], first[-1][1] + second[0][1]]] + second[1:]
    return first + second
