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


def block_slots(block_table: Sequence[int], length: int, block_size: int) -> list[int]:
    """The physical slots of logical indices 0..length-1 (the reads of a request of that length)."""
    return [block_table[j // block_size] * block_size + j % block_size for j in range(length)]


class SlotLedger:
    """The last write to each slot of one cache (target or draft)."""

    def __init__(self) -> None:
        self.held: dict[int, Entry] = {}

    def write(self, slots: Sequence[int], positions: Sequence[int], base: int | None, tokens: Sequence[int]) -> None:
        """One segment's writes, its tokens chained on `base` (the writer's prefix before them; None:
        unknown, and what it writes then matches nothing). Slot -1 is vLLM's padding: no write."""
        hashes = prefixes(tokens, base) if base is not None else [None] * len(tokens)
        for slot, position, prefix in zip(slots, positions, hashes):
            if slot >= 0:
                self.held[slot] = (position, prefix)

    def adopt(self, slots: Sequence[int], hashes: Sequence[int]) -> None:
        """Slots a request found in vLLM's prefix cache that no write seen by the watch filled (they
        were written before it began): taken as the cache's hash says, holding that prefix."""
        for j, (slot, prefix) in enumerate(zip(slots, hashes)):
            self.held.setdefault(slot, (j, prefix))

    def attended(self, reads: Sequence[int], hashes: Sequence[int]) -> list[bool]:
        """Per logical index j < len(hashes): slot reads[j] holds position j of this prefix."""
        return [self.held.get(reads[j]) == (j, hashes[j]) for j in range(min(len(reads), len(hashes)))]


def runs(flags: Sequence[bool]) -> list[list[int]]:
    """Run-length code of a row of booleans, as a trace's mask_rle: [[value, count], ...]."""
    out: list[list[int]] = []
    for flag in flags:
        value = int(flag)
        if out and out[-1][0] == value:
            out[-1][1] += 1
        else:
            out.append([value, 1])
    return out
