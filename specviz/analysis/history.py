"""The token history the checker rebuilds from the rows' writes, never from the engine's own claims.

`History` holds the run's rules (k, the token budget, the EOS ids, the layout) and one
`SequenceHistory` per sequence; `apply_write` advances a sequence by what one row wrote to it.
Every expected value of the checks is derived from here.
"""

from __future__ import annotations

import array
import bisect
import functools
from dataclasses import dataclass, field

from specviz.analysis.budgets import sequence_budgets
from specviz.trace.schema import RowRecord, Trace


@dataclass
class SequenceHistory:
    """What one sequence has been given so far, as the rows written to it show.

    Only O(1) per sequence, whatever the run's length: the steps that wrote particular output
    tokens are kept for the token indices registered with `watch` before the walk (the checker's
    verdicts ask for a few: the divergence, the budget, an early EOS), not for every step.
    """

    prompt_len: int
    last_token: int  # the pending token: the last committed one
    budget: int = 0  # its max_new_tokens: the run's, or its own (a watched engine with one per sequence)
    written: int = 0  # output tokens written to it
    finished_at: int | None = None  # step index at which it finished
    last_touched: int | None = None  # step index of the last step that wrote to it
    watched: list[int] = field(default_factory=list)  # registered token indices not yet written, ascending
    token_steps: dict[int, int] = field(default_factory=dict)  # registered token index -> step index writing it

    def watch(self, index: int) -> None:
        """Remember which step writes output token `index` (call before the walk)."""
        if index not in self.watched and index not in self.token_steps:
            bisect.insort(self.watched, index)

    def wrote(self, si: int, written: int) -> None:
        """Step index `si` wrote tokens up to `written` (exclusive) to this sequence."""
        self.written = written
        self.last_touched = si
        while self.watched and self.watched[0] < written:
            self.token_steps[self.watched.pop(0)] = si

    def step_of_token(self, index: int) -> int | None:
        """Index of the step that wrote output token `index` (the last writing step past the end);
        `index` must have been registered with `watch`."""
        if index not in self.token_steps and index not in self.watched:
            raise KeyError(f"token index {index} was not watched")
        return self.token_steps.get(index, self.last_touched)


class History:
    """The run's rules and every sequence's history, advanced step by step."""

    def __init__(self, trace: Trace) -> None:
        h = trace.header
        self.trace = trace
        self.k = h.draft_k
        # Rectangular alignment is a rule of the left-padded layout only; other layouts get the
        # layout-free invariants (positions, attended slots, accounting).
        self.left_padded = h.layout == "left-padded"
        # A declared layout (specviz's own engines) drafts k tokens per row and step; an unspecified
        # one (watched engines) may draft d in 0..k, per row and per step (k is then the maximum).
        self.declared_layout = h.layout != "unspecified"
        self.ragged = not self.declared_layout
        # A budget per sequence (watched engines), else the run's max_new_tokens.
        own = sequence_budgets(h, (s.seq_id for s in trace.sequences))
        self.eos = frozenset(h.eos_token_ids)
        self.step_numbers = array.array("q")  # `step` of each step index walked so far
        # Steps from the first on that pad their rows and mask no slot: an engine that passes no
        # mask (`row_checks._padding_hint`); computed once, on the first row that needs it.
        self.unmasked_padded_steps: int | None = None
        self.seqs = {
            s.seq_id: SequenceHistory(
                prompt_len=len(s.prompt_ids),
                last_token=s.prompt_ids[-1],
                budget=own[s.seq_id],
            )
            for s in trace.sequences
        }

    @functools.cached_property
    def _next_rows(self) -> dict[tuple[int, int], RowRecord]:
        """(sequence, step index) -> the sequence's row at its next step."""
        out: dict[tuple[int, int], RowRecord] = {}
        last: dict[int, int] = {}
        for si, step in enumerate(self.trace.steps):
            for row in step.rows:
                if row.seq_id in last:
                    out[row.seq_id, last[row.seq_id]] = row
                last[row.seq_id] = si
        return out

    def next_row(self, seq_id: int, si: int) -> RowRecord | None:
        """The sequence's row at its next step after step index `si` (None: none)."""
        return self._next_rows.get((seq_id, si))

    def context(self, seq_id: int, length: int) -> list[int]:
        """The sequence's first `length` committed tokens: its prompt, then its recorded output."""
        seq = next((s for s in self.trace.sequences if s.seq_id == seq_id), None)
        return [] if seq is None else (seq.prompt_ids + seq.output_ids)[:length]

    def cut(self, proposal: list[int], seq: SequenceHistory) -> list[int]:
        """The proposal as the sequence may take it: within the budget, nothing after an EOS."""
        out = proposal[: max(0, seq.budget - seq.written)]
        for i, token in enumerate(out):
            if token in self.eos:
                return out[: i + 1]
        return out

    def apply_write(self, si: int, row: RowRecord) -> None:
        """Advance the row's write target by its emitted tokens at step index `si`."""
        seq = self.seqs[row.write_seq]
        if row.emitted:
            seq.last_token = row.emitted[-1]
            seq.wrote(si, seq.written + len(row.emitted))
        done = row.emitted and (row.emitted[-1] in self.eos) or seq.written >= seq.budget
        if done and seq.finished_at is None:
            seq.finished_at = si
