"""The batch map (docs/watch.md, "The batch map"): who is where in one forward call, the one immutable
type every producer returns; a call it recognises but cannot read is `BatchMap.unread(source, why)`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _ints(name: str, values: tuple[int, ...] | None, length: int | None) -> None:
    """Refuse a field that is not a tuple of ints, or not of `length` entries where one is given."""
    if values is None:
        return
    if not isinstance(values, tuple) or any(type(v) is not int for v in values):  # bool is no index
        raise TypeError(f"Segment.{name} must be a tuple of ints")
    if length not in (None, len(values)):
        raise ValueError(f"Segment.{name} has {len(values)} entries for {length} query tokens")


def tree_error(parents: Any) -> str | None:
    """Why `parents` is not a tree over its nodes (None: it is): node 0 the root, each parent earlier."""
    if not isinstance(parents, (list, tuple)) or not parents:
        return "a tree is a non-empty list of parent indices"
    if any(type(p) is not int for p in parents):  # bool is no index
        return "parent indices must be integers"
    if parents[0] != -1:
        return "node 0 (the pending token) must be the root, parent -1"
    if any(not 0 <= p < i for i, p in enumerate(parents[1:], 1)):
        return "each node's parent must be an earlier node"
    return None


@dataclass(frozen=True)
class Segment:
    """One sequence's query tokens in one forward: `length` tokens from column `start` of `row`."""

    seq: int | None  # sequence index in the run; None: not said (the inferrer or the default order decides)
    row: int  # row of the forward's [B, T] input (0 for a packed 1 x T call)
    start: int  # first query column in that row
    length: int  # query tokens
    keys: tuple[int, int] | None = None  # [lo, hi): its own key columns in a shared KV (`cu_seq_lens_k`)
    drafts: int | None = None  # draft tokens at its end; None: not said (read from the draft calls)
    chunk: bool = False  # a prefill chunk that stops short of the prompt's end: yields no token
    # A tree verify: the parent of each of its last len(parents) query tokens, in order; node 0 is
    # the pending token (parent -1) and every other node's parent is an earlier node. None: a chain.
    parents: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None  # [length] position fed to each query token, where said
    writes: tuple[int, ...] | None = None  # [length] physical KV slot each query token writes, where said
    reads: tuple[int, ...] | None = None  # physical KV slots its last query token attends, in logical order
    request: str | None = None  # the engine's own name for the sequence (vLLM's req_id)

    def __post_init__(self) -> None:
        if self.length <= 0 or self.start < 0 or self.row < 0:
            raise ValueError(f"Segment needs row >= 0, start >= 0 and length > 0, got {self}")
        if self.drafts is not None and not 0 <= self.drafts < self.length:
            raise ValueError(f"Segment of {self.length} query tokens cannot carry {self.drafts} drafts")
        if self.chunk and self.drafts:
            raise ValueError("a prefill chunk carries no drafts")
        if self.keys is not None and not 0 <= self.keys[0] <= self.keys[1]:
            raise ValueError(f"Segment.keys must be [lo, hi) with 0 <= lo <= hi, got {self.keys}")
        for name, length in (("positions", self.length), ("writes", self.length), ("reads", None), ("parents", None)):
            _ints(name, getattr(self, name), length)
        if self.parents and (tree_error(self.parents) or len(self.parents) > self.length):  # (): no node
            raise ValueError(f"Segment.parents {self.parents}: no tree (`tree_error`) of at most {self.length} nodes")

    @property
    def columns(self) -> range:
        """The query columns of `row` that hold this segment."""
        return range(self.start, self.start + self.length)

    def roles(self) -> list[str]:
        """Per query token: context, then the pending token, then the drafts; [] where the draft
        count was not said (a chunk is all context)."""
        if self.chunk:
            return ["context"] * self.length
        if self.drafts is None:
            return []
        return ["context"] * (self.length - self.drafts - 1) + ["pending"] + ["draft"] * self.drafts


@dataclass(frozen=True)
class BatchMap:
    """Who is where in one forward call. B rows x T columns in; S segments out, in forward order."""

    segments: tuple[Segment, ...]  # [S]
    # who said it: "declared" | "paged" (transformers' continuous batching) | "vllm" | "padded" |
    # "cu_seq_lens" | "block-mask" | "positions" | "inferred"
    source: str
    unreadable: str | None = None  # why the producer that recognised the call cannot map it

    def __post_init__(self) -> None:
        if self.unreadable is not None and self.segments:
            raise ValueError("an unreadable map has no segments")
        seqs = [s.seq for s in self.segments if s.seq is not None]
        if len(seqs) != len(set(seqs)):
            raise ValueError(f"a sequence appears twice in one forward: {seqs}")
        spans = sorted((s.row, s.start, s.start + s.length) for s in self.segments)
        for (row, _, end), (later_row, start, _) in zip(spans, spans[1:]):
            if (later_row, start) < (row, end):  # in (row, column) order: it starts before the one before ends
                raise ValueError(f"segments overlap in row {row}")

    @classmethod
    def unread(cls, source: str, why: str) -> BatchMap:
        """A map its producer recognised but could not read, with the reason the trace will say."""
        return cls((), source, why)

    @property
    def readable(self) -> bool:
        return self.unreadable is None

    @property
    def packed(self) -> bool:
        """More than one sequence in a row, or one that does not start at column 0: some segment
        starts past column 0 (two in one row do not overlap, so one of them does)."""
        return any(s.start for s in self.segments)
