"""Chunk continuity of a chunked prefill (schema 4), on the row of a sequence's first step after it.

The row records the target's chunks, `prefill_chunks` ([start, end, position of the first token,
attended slots before it], in order), and what the draft was fed, `draft_prefill_tokens`. With n
= `committed_before`, the prefill cached the context's first n - 1 tokens, so:
  POSITIONS: each chunk's first token is fed at position `start`;
  KV: the chunks tile 0 .. n - 1 in order (each starts where the last ended), and each attends
      exactly the `start` slots the earlier chunks cached;
  DRAFT_INPUT: the draft was fed the context's own tokens, (prompt + output)[:n - 1], at every
      chunk boundary too.
"""

from __future__ import annotations

from specviz.analysis.findings import RowFlags
from specviz.analysis.history import History
from specviz.trace.invariants import Invariant


def check_prefill_row(flag: RowFlags, history: History) -> None:
    row = flag.row
    if row.prefill_chunks is not None:
        _check_chunks(flag, row.prefill_chunks, row.committed_before - 1)
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
        if len(chunk) != 4:
            flag(Invariant.KV, "prefill_chunks", "[start, end, position, slots before]", chunk, f"chunk {i} malformed")
            return
        start, stop, position, before = chunk
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
