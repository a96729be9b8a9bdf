"""EXSPEC's grouping policies: the order sequences enter the window and which group each step takes.

Pure functions of committed lengths (`benchmarks/grouping_sim.py` runs them over SpecBench prompt
lengths without a model); the policies themselves are described in `exspec.py`.
"""

from __future__ import annotations

from collections import defaultdict

from specviz.engine.batch import SeqState

POLICIES = ("reference", "largest", "converge")


def admission_order(seqs: list[SeqState], policy: str) -> list[SeqState]:
    """The order sequences enter the sliding window: `converge` admits short prompts first."""
    if policy == "converge":
        return sorted(seqs, key=lambda s: s.committed)  # stable: ties keep prompt order
    return list(seqs)


def select_group(window: list[SeqState], batch_size: int, policy: str) -> list[SeqState]:
    want = min(batch_size, len(window))
    groups: dict[int, list[SeqState]] = defaultdict(list)
    for seq in window:
        groups[seq.committed].append(seq)
    if policy == "reference":
        return _first_full_group(window, groups, want)
    if policy == "largest":
        return _largest_group(window, groups, want)
    if policy == "converge":
        return _shortest_group(window, groups, want)
    raise ValueError(f"unknown exspec policy {policy!r}; choose from {', '.join(POLICIES)}")


def _first_full_group(window: list[SeqState], groups: dict[int, list[SeqState]], want: int) -> list[SeqState]:
    for seq in window:
        if len(groups[seq.committed]) >= want:
            return groups[seq.committed][:want]
    return window[:want]


def _largest_group(window: list[SeqState], groups: dict[int, list[SeqState]], want: int) -> list[SeqState]:
    best = max(groups.values(), key=len)  # dict order = window order, so ties go early
    if len(best) >= max(1, (want + 1) // 2):
        return best[:want]
    return window[:want]


def _shortest_group(window: list[SeqState], groups: dict[int, list[SeqState]], want: int) -> list[SeqState]:
    for need in (want, max(1, -(-3 * want // 4))):  # a full batch, else three quarters of one
        lengths = [length for length, members in groups.items() if len(members) >= need]
        if lengths:
            return groups[min(lengths)][:want]
    shortest = groups[min(groups)]
    if len(shortest) >= max(1, (want + 1) // 2):
        return shortest
    return sorted(window, key=lambda s: s.committed)[:want]
