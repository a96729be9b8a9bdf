"""Chunk continuity of a chunked prefill (schema 4, carriers 5), on the row of a sequence's first step after it.

The row records the target's chunks, `prefill_chunks` ([start, end, position of the first token,
attended slots before it, carrier], in order; version-4 files lack the carrier), and what the
draft was fed, `draft_prefill_tokens`. The carrier is the step whose verify forward also carried
the chunk (EXSPEC's mixed prefill, `engine/mixed.py`), -1 for a forward of its own. With n =
`committed_before`, the prefill cached the context's first n - 1 tokens, so:
  POSITIONS: each chunk's first token is fed at position `start`;
  KV: the chunks tile 0 .. n - 1 in order (each starts where the last ended), and each attends
      exactly the `start` slots the earlier chunks cached;
  KV (carrier): a carried chunk's step is a step of the run, walked before this one, in which
      the sequence was not running yet (its chunks filled its cache before it ran), and carriers
      never go back in time from chunk to chunk;
  DRAFT_INPUT: the draft was fed the context's own tokens, (prompt + output)[:n - 1], at every
      chunk boundary too.
"""

from __future__ import annotations

import bisect

from specviz.analysis.findings import RowFlags
from specviz.analysis.history import History
from specviz.trace.invariants import Invariant
from specviz.trace.schema import Trace

NO_CARRIER = -1  # the chunk had a target forward of its own (engine/mixed.py)


def check_prefill_row(flag: RowFlags, history: History) -> None:
    row = flag.row
    if row.prefill_chunks is not None:
        _check_chunks(flag, row.prefill_chunks, row.committed_before - 1)
        _check_carriers(flag, row.prefill_chunks, history)
    if row.draft_prefill_tokens is not None:
        expected = history.context(row.seq_id, row.committed_before - 1)
        fed = row.draft_prefill_tokens
        if fed != expected:
            at = next((i for i, (a, b) in enumerate(zip(fed, expected)) if a != b), min(len(fed), len(expected)))
            flag(
                Invariant.DRAFT_INPUT,
                "draft_prefill_tokens",
                expected,
                fed,
                f"the draft's prefill fed token {fed[at] if at < len(fed) else None} at context index {at}, "
                f"not the context's own {expected[at] if at < len(expected) else None}",
            )


def _check_chunks(flag: RowFlags, chunks: list[list[int]], cached: int) -> None:
    end = 0
    for i, chunk in enumerate(chunks):
        if len(chunk) not in (4, 5):
            shape = "[start, end, position, slots before, carrier]"
            flag(Invariant.KV, "prefill_chunks", shape, chunk, f"chunk {i} malformed")
            return
        start, stop, position, before = chunk[:4]
        if start != end or stop <= start:
            flag(
                Invariant.KV,
                "prefill_chunks",
                f"a chunk starting at {end}",
                chunk,
                f"prefill chunk {i} covers {start}..{stop}, but the chunks before it ended at {end}",
            )
            return
        if position != start:
            flag(
                Invariant.POSITIONS,
                "prefill_chunks",
                start,
                position,
                f"prefill chunk {i} starts at context index {start} but was fed position {position}",
            )
        if before != start:
            flag(
                Invariant.KV,
                "prefill_chunks",
                start,
                before,
                f"prefill chunk {i} attended {before} cached slots before it, not the {start} its earlier chunks wrote",
            )
        end = stop
    if end != cached:
        flag(
            Invariant.KV,
            "prefill_chunks",
            cached,
            end,
            f"the prefill's chunks cached {end} context tokens, not the {cached} before the pending one",
        )


def _check_carriers(flag: RowFlags, chunks: list[list[int]], history: History) -> None:
    """Each carried chunk rode in a step of the run before this row's, in which the sequence did
    not run yet, and in order."""
    walked = history.step_numbers  # `step` of every step walked so far, this one last (increasing)
    touched = history.seqs[flag.row.seq_id].last_touched if flag.row.seq_id in history.seqs else None
    ran_until = walked[touched] if touched is not None else None  # the last step that wrote to it
    latest = NO_CARRIER
    for i, chunk in enumerate(chunks):
        if len(chunk) != 5 or chunk[4] == NO_CARRIER:
            continue
        carrier = chunk[4]
        at = bisect.bisect_left(walked, carrier)
        if not (0 <= carrier < flag.step.step and at < len(walked) and walked[at] == carrier):
            flag(
                Invariant.KV,
                "prefill_chunks",
                f"a step of the run before {flag.step.step} (or -1)",
                carrier,
                f"prefill chunk {i} was carried by step {carrier}, "
                f"not a step of the run before the sequence's first ({flag.step.step})",
            )
            return
        if ran_until is not None and carrier <= ran_until:
            flag(
                Invariant.KV,
                "prefill_chunks",
                f"a step after {ran_until}, the sequence's last before this one",
                carrier,
                f"prefill chunk {i} was carried by step {carrier}, while the sequence itself was running",
            )
            return
        if carrier < latest:
            flag(
                Invariant.KV,
                "prefill_chunks",
                f"a step at or after {latest}",
                carrier,
                f"prefill chunk {i} was carried by step {carrier}, "
                f"before the step {latest} that carried an earlier chunk",
            )
            return
        latest = carrier


def carried_chunks(trace: Trace) -> list[tuple[int, int, list[int]]]:
    """(carrier step, seq_id, chunk) of every chunk a verify forward carried, by carrier step."""
    carried = [
        (chunk[4], row.seq_id, chunk)
        for step in trace.steps
        for row in step.rows
        for chunk in row.prefill_chunks or ()
        if len(chunk) == 5 and chunk[4] != NO_CARRIER
    ]
    return sorted(carried, key=lambda c: (c[0], c[1], c[2][0]))
