"""The token history the checker rebuilds from the rows' writes, never from the engine's own claims.

`History` holds the run's rules (k, the token budget, the EOS ids, the layout) and one
`SequenceHistory` per sequence; `apply_write` advances a sequence by what one row wrote to it.
Every expected value of the checks is derived from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specviz.trace.schema import RowRecord, Trace


@dataclass
class SequenceHistory:
    """What one sequence has been given so far, as the rows written to it show."""

    prompt_len: int
    last_token: int  # the pending token: the last committed one
    written: int = 0  # output tokens written to it
    finished_at: int | None = None  # step index at which it finished
    touched_steps: list[int] = field(default_factory=list)  # step indices writing to it
    cumulative: list[int] = field(default_factory=list)  # tokens written after each of those

    def step_of_token(self, index: int) -> int | None:
        """Index of the step that wrote output token `index` (the last writing step past the end)."""
        for si, written in zip(self.touched_steps, self.cumulative):
            if written > index:
                return si
        return self.touched_steps[-1] if self.touched_steps else None


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
        self.max_new = h.max_new_tokens
        self.eos = frozenset(h.eos_token_ids)
        self.seqs = {
            s.seq_id: SequenceHistory(prompt_len=len(s.prompt_ids), last_token=s.prompt_ids[-1])
            for s in trace.sequences
        }

    def cut(self, proposal: list[int], seq: SequenceHistory) -> list[int]:
        """The proposal as the sequence may take it: within the budget, nothing after an EOS."""
        out = proposal[: max(0, self.max_new - seq.written)]
        for i, token in enumerate(out):
            if token in self.eos:
                return out[: i + 1]
        return out

    def apply_write(self, si: int, row: RowRecord) -> None:
        """Advance the row's write target by its emitted tokens at step index `si`."""
        seq = self.seqs[row.write_seq]
        if row.emitted:
            seq.written += len(row.emitted)
            seq.last_token = row.emitted[-1]
            seq.touched_steps.append(si)
            seq.cumulative.append(seq.written)
        done = row.emitted and (row.emitted[-1] in self.eos) or seq.written >= self.max_new
        if done and seq.finished_at is None:
            seq.finished_at = si
