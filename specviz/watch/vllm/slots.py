"""Which token each physical KV slot holds, as vLLM's own slot_mapping wrote it.

A paged engine keeps a request's KV in the blocks of its block table: the token at logical index j
lives in slot `block_table[j // block_size] * block_size + j % block_size`. The ledger replays
every write the runner declared (slot_mapping, one slot per fed token) as (request, position fed,
token fed), so a read can be judged without the cache itself: the slot a request attends at
logical index j must hold that request's committed token j, fed at position j. A write into
another request's block, a token fed at the wrong position, a rejected draft left behind, a slot
never written: each shows as a slot that does not hold what the request attends it for.
The target and the draft model have separate caches over the same block numbering: one ledger each.
"""

from __future__ import annotations

from collections.abc import Sequence

Entry = tuple[str, int, int]  # (request id, position fed, token fed)


def block_slots(block_table: Sequence[int], length: int, block_size: int) -> list[int]:
    """The physical slots of logical indices 0..length-1 (the reads of a request of that length)."""
    return [block_table[j // block_size] * block_size + j % block_size for j in range(length)]


class SlotLedger:
    """The last write to each slot of one cache (target or draft)."""

    def __init__(self) -> None:
        self.held: dict[int, Entry] = {}

    def write(self, request: str, slots: Sequence[int], positions: Sequence[int], tokens: Sequence[int]) -> None:
        """One segment's writes; slot -1 is vLLM's padding (nothing written)."""
        for slot, position, token in zip(slots, positions, tokens):
            if slot >= 0:
                self.held[slot] = (request, position, token)

    def holds(self, slot: int, request: str, index: int, token: int) -> bool:
        return self.held.get(slot) == (request, index, token)

    def attended(self, request: str, reads: Sequence[int], tokens: Sequence[int]) -> list[bool]:
        """Per logical index j < len(tokens): slot reads[j] holds `request`'s token j at position j."""
        return [self.holds(reads[j], request, j, tokens[j]) for j in range(min(len(reads), len(tokens)))]


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
