"""The invariants a correct batched speculative step preserves: one numbered list, cited everywhere.

The numbers are part of the trace's and the report's public format (a `Violation` carries one), so
they never change meaning. Each is stated for one row, whatever the memory layout, except
ALIGNMENT, a layout rule checked only for traces that declare the left-padded contiguous layout.
docs/architecture.md and docs/forensics.md cite this list; the engine's faults name members of it.
"""

from __future__ import annotations

from enum import IntEnum


class Invariant(IntEnum):
    # Layout rule (left-padded contiguous only): one width for all rows, each row `0^pad 1^rest`.
    ALIGNMENT = 1
    # The token at logical index j is fed at position j; the verify block at n-1 .. n-1+d.
    POSITIONS = 2
    # The attended cache slots hold exactly the row's committed tokens (minus the pending one).
    KV = 3
    # 0 <= accepted <= drafted, emitted = accepted + bonus, cut at EOS and the length limit,
    # written to the row's own sequence; a finished sequence never comes back.
    ACCOUNTING = 4
    # Each sequence's output equals batch-1 greedy decoding of the target.
    OUTPUT = 5
    # Head drafting (schema 3): each row's draft head is fed the target's hidden state of that
    # row's own sequence at its last cached token (logical index n-2). A drafting rule: breaking
    # it may keep outputs exact and only cost acceptance.
    HEAD = 6
    # Draft inputs (schema 4): each draft call feeds the row's own latest token: the pending token
    # at call 0, the row's own draft of call j - 1 at call j. A drafting rule, like HEAD: breaking
    # it keeps outputs exact and costs acceptance, from the call it first breaks at.
    DRAFT_INPUT = 7
    # Sampling state (schema 4): the token history a repetition penalty reads (and any
    # per-sequence counter that follows it) equals the prompt plus every token emitted so far,
    # after every step: a speculative step emits accepted + 1 tokens, not one.
    SAMPLING_STATE = 8

    @property
    def slug(self) -> str:
        """The stable name written into reports ("position-contiguity", ...)."""
        return _SLUGS[self]


_SLUGS = {
    Invariant.ALIGNMENT: "rectangular-alignment",
    Invariant.POSITIONS: "position-contiguity",
    Invariant.KV: "kv-consistency",
    Invariant.ACCOUNTING: "token-accounting",
    Invariant.OUTPUT: "output-equivalence",
    Invariant.HEAD: "head-input",
    Invariant.DRAFT_INPUT: "draft-input",
    Invariant.SAMPLING_STATE: "sampling-state",
}

# The invariants checked on the recorded state: every `Violation` names one of these. OUTPUT is
# judged per sequence against the reference, by the verdicts (docs/forensics.md).
STATE_INVARIANTS = (
    Invariant.ALIGNMENT,
    Invariant.POSITIONS,
    Invariant.KV,
    Invariant.ACCOUNTING,
    Invariant.HEAD,
    Invariant.DRAFT_INPUT,
    Invariant.SAMPLING_STATE,
)
