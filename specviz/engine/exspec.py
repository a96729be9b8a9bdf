"""EXSPEC: a pool of sequences with their own caches, batched by equal length when possible.

Each sequence keeps single-row target and draft caches. Every step picks up to B sequences from
a sliding window over the unfinished ones; sequences of equal committed length stack with no
padding and no realignment. When no such group exists the step falls back to stacking mixed
lengths with left padding (EQSPEC-style). After the step the batch is split back into the pool.

Policies:
- `reference`: the paper's: the first length in window order with at least B sequences, else
  fall back to the first B of the window.
- `largest`: the largest equal-length group in the window, used when it fills at least half
  a batch (a smaller unpadded batch beats a padded full one at these sizes); else fall back.
- `converge`: length-aware admission plus shortest-first selection. Equal lengths are rare
  because committed lengths start far apart (prompt lengths differ by hundreds of tokens) and
  drift apart (rows accept different numbers of drafts), so this policy steers them together:
  sequences enter the window in prompt-length order (the window holds similar lengths), and
  the shortest sequences are served first, so laggards catch up while leaders wait and the
  window's lengths stay within a few tokens of each other. Each step takes the first of:
  a full batch of one length (the shortest such length); a group of one length filling at
  least 3/4 of a batch (shortest such); the window's shortest length if it fills half a
  batch; else the B shortest sequences (padded, but from a narrow band, and advancing the
  rows that hold the others back). The thresholds trade a few rows per step for group share
  (benchmarks/grouping_sim.py runs this policy code over SpecBench prompt lengths).
  Scheduling order never changes a sequence's tokens, so output stays exact; short prompts
  finish first.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from specviz.engine.kv import KVState, leading_zeros, rebuild, split, stack
from specviz.engine.step import Batch, Engine, Sequence

POLICIES = ("reference", "largest", "converge")


def admission_order(seqs: list[Sequence], policy: str) -> list[Sequence]:
    """The order sequences enter the sliding window: `converge` admits short prompts first."""
    if policy == "converge":
        return sorted(seqs, key=lambda s: s.committed)  # stable: ties keep prompt order
    return list(seqs)


def select_group(window: list[Sequence], batch_size: int, policy: str) -> list[Sequence]:
    want = min(batch_size, len(window))
    groups: dict[int, list[Sequence]] = defaultdict(list)
    for seq in window:
        groups[seq.committed].append(seq)
    if policy == "reference":
        return _first_full_group(window, groups, want)
    if policy == "largest":
        return _largest_group(window, groups, want)
    if policy == "converge":
        return _shortest_group(window, groups, want)
    raise ValueError(f"unknown exspec policy {policy!r}; choose from {', '.join(POLICIES)}")


def _first_full_group(window: list[Sequence], groups: dict[int, list[Sequence]], want: int) -> list[Sequence]:
    for seq in window:
        if len(groups[seq.committed]) >= want:
            return groups[seq.committed][:want]
    return window[:want]


def _largest_group(window: list[Sequence], groups: dict[int, list[Sequence]], want: int) -> list[Sequence]:
    best = max(groups.values(), key=len)  # dict order = window order, so ties go early
    if len(best) >= max(1, (want + 1) // 2):
        return best[:want]
    return window[:want]


def _shortest_group(window: list[Sequence], groups: dict[int, list[Sequence]], want: int) -> list[Sequence]:
    for need in (want, max(1, -(-3 * want // 4))):  # a full batch, else three quarters of one
        lengths = [length for length, members in groups.items() if len(members) >= need]
        if lengths:
            return groups[min(lengths)][:want]
    shortest = groups[min(groups)]
    if len(shortest) >= max(1, (want + 1) // 2):
        return shortest
    return sorted(window, key=lambda s: s.committed)[:want]


def run_exspec(
    engine: Engine,
    seqs: list[Sequence],
    batch_size: int,
    window_size: int,
    policy: str = "largest",
) -> dict[str, Any]:
    from transformers import DynamicCache

    if window_size < batch_size:
        raise ValueError(f"exspec window ({window_size}) must be at least the batch size ({batch_size})")
    target_states: dict[int, KVState] = {}
    draft_states: dict[int, KVState] = {}
    queue = admission_order(seqs, policy)
    steps = grouped_steps = 0
    previous: list[int] | None = None
    while True:
        window = [s for s in queue if not s.done][:window_size]
        if not window:
            break
        for seq in window:
            if seq.seq_id not in target_states:  # admitted: prefill alone, no padding
                target_states[seq.seq_id] = engine.prefill(engine.target, [seq])
                if engine.draft is not None:
                    draft_states[seq.seq_id] = engine.prefill(engine.draft, [seq])
        chosen = select_group(window, batch_size, policy)
        grouped = len({s.committed for s in chosen}) == 1
        ids = [s.seq_id for s in chosen]
        align_started = engine.now()
        target = stack([target_states.pop(i) for i in ids], DynamicCache)
        draft = stack([draft_states.pop(i) for i in ids], DynamicCache) if engine.draft is not None else None
        batch = Batch(chosen, target, draft, batch_id=0, grouped=grouped)
        batch.regrouped = previous is not None and ids != previous
        previous = ids
        stack_s = engine.now() - align_started
        outcome = engine.step(batch)
        outcome.started -= stack_s  # the stacking belongs to this step's alignment time
        align_started = engine.now() - stack_s
        rows = outcome.active_rows
        new_target = rebuild(batch.target, rows, outcome.target_plan)
        new_draft = None
        if draft is not None and outcome.draft_plan is not None:
            new_draft = rebuild(draft, rows, outcome.draft_plan)
        left_pad_after: list[int | None] = [None] * len(chosen)
        target_parts = split(new_target, DynamicCache)
        draft_parts = split(new_draft, DynamicCache) if new_draft is not None else []
        for new_row, old_row in enumerate(rows.tolist()):
            seq_id = chosen[old_row].seq_id
            target_states[seq_id] = target_parts[new_row]
            left_pad_after[old_row] = _pad(target_parts[new_row])
            if draft_parts:
                draft_states[seq_id] = draft_parts[new_row]
        engine.finish_step(outcome, left_pad_after, align_started)
        steps += 1
        grouped_steps += int(grouped)
    return {"steps": steps, "grouped_steps": grouped_steps, "group_share": grouped_steps / max(steps, 1)}


def _pad(state: KVState) -> int:
    return int(leading_zeros(state.mask)[0]) if state.width else 0
