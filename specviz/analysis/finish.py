"""Finish reasons and run completeness: every prompt accounted for, every ending justified.

Endings are derived from the token history the checker reconstructs, never from what the engine
says about itself:
- a row's `finish_reason` is "eos" only if its sequence received an EOS token at that step, and
  "length" only if the sequence reached exactly its budget then (its own in
  `header.options.sequence_budgets`, else `max_new_tokens`; both endings are allowed when the last
  token of the budget is an EOS); a sequence that ended and whose row says nothing is flagged;
- nothing may follow an EOS inside one step's emitted tokens;
- a sequence's own `finish_reason` must agree with its `output_ids`;
- in a run marked complete, every sequence must have finished, and have been scheduled unless its
  budget is 0.
A sequence that was never decoded is located at the run (the last step, row -1, or step -1 when
the run has no steps at all); one that was dropped is located at the last step that held it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specviz.analysis.findings import Findings, RowFlags, stub_row
from specviz.analysis.history import History, SequenceHistory
from specviz.trace.invariants import Invariant
from specviz.trace.schema import SequenceRecord, StepRecord

# Endings are part of what a sequence was given: every finish violation is token accounting.
ACCOUNTING = Invariant.ACCOUNTING
NO_ROW_FINISH = ("row finish reasons", "no row records finished / finish_reason")


def records_row_finish(steps: Sequence[StepRecord]) -> bool:
    """Row finish fields are optional: a trace in which no row records one did not record them."""
    columnar = getattr(steps, "records_row_finish", None)
    if columnar is not None:  # the steps of a Parquet trace answer from two columns, not a full read
        return columnar()
    return any(row.finished or row.finish_reason is not None for step in steps for row in step.rows)


def allowed_endings(tokens: list[int], written: int, max_new: int, eos: frozenset[int]) -> set[str]:
    """Finish reasons that the tokens justify; empty if the sequence has not ended."""
    allowed = set()
    if any(token in eos for token in tokens):
        allowed.add("eos")
    if written >= max_new:
        allowed.add("length")
    return allowed


class FinishChecks:
    """Finish-reason and completeness checks, fed step by step as the checker walks the trace."""

    def __init__(self, findings: Findings, history: History) -> None:
        self.findings = findings
        self.history = history
        self.records_finish = records_row_finish(history.trace.steps)
        self.last_seen: dict[int, int] = {}  # seq_id -> last step index holding or receiving it

    # ------------------------------------------------------------------ per step

    def check_step(self, si: int, step: StepRecord) -> None:
        """Called after the step's writes were applied to the sequences' histories."""
        received: dict[int, list[int]] = {}
        for row in step.rows:
            self.last_seen[row.seq_id] = si
            self.last_seen[row.write_seq] = si
            received.setdefault(row.write_seq, []).extend(row.emitted)
            check_nothing_after_eos(self.findings.at(si, step, row), self.history)
        if not self.records_finish:
            self.findings.skip(*NO_ROW_FINISH)
            return
        for row in step.rows:
            check_row_reason(self.findings.at(si, step, row), self.history, received.get(row.seq_id, []))

    # ------------------------------------------------------------------ per sequence, end of run

    def check_run(self) -> None:
        history = self.history
        complete = history.trace.header.complete
        for seq in history.trace.sequences:
            state = history.seqs[seq.seq_id]
            last = self.last_seen.get(seq.seq_id)
            if complete and last is None and state.budget > 0:  # a budget of 0 is never decoded
                self._flag(
                    None,
                    seq.seq_id,
                    "seq_id",
                    "scheduled and finished",
                    "never scheduled",
                    f"sequence {seq.seq_id} was never decoded in a run marked complete",
                )
                continue
            if complete and last is not None and state.finished_at is None:
                self._flag(
                    last,
                    seq.seq_id,
                    "finish_reason",
                    "eos or length",
                    "unfinished",
                    f"sequence {seq.seq_id} left the batch unfinished ({state.written} of {state.budget} "
                    "tokens, no EOS) in a run marked complete",
                )
                continue
            self._check_sequence_reason(seq, state, last, complete)

    def _check_sequence_reason(
        self, seq: SequenceRecord, state: SequenceHistory, last: int | None, complete: bool
    ) -> None:
        history = self.history
        where = state.last_touched if state.last_touched is not None else last
        allowed = allowed_endings(seq.output_ids[-1:], len(seq.output_ids), state.budget, history.eos)
        reason = seq.finish_reason
        if reason is None and complete:
            # No ending is a fault of the run's end, not of the last write: shown at the last step
            # that held the sequence (a wrong-row write ends another sequence before this one's).
            self._flag(
                last if last is not None else where,
                seq.seq_id,
                "finish_reason",
                sorted(allowed) or "eos or length",
                None,
                f"sequence {seq.seq_id} has no finish_reason in a run marked complete",
            )
        elif reason is not None and reason not in allowed:
            self._flag(
                where,
                seq.seq_id,
                "finish_reason",
                sorted(allowed) or None,
                reason,
                _wrong_reason(reason, seq.seq_id, seq.output_ids[-1:], len(seq.output_ids), state.budget),
            )

    def _flag(self, si: int | None, seq_id: int, fld: str, expected: Any, actual: Any, message: str) -> None:
        """A sequence-level violation at step index `si`, or at the run when `si` is None."""
        steps = self.history.trace.steps
        if si is None and not steps:
            self.findings.flag_run(seq_id, ACCOUNTING, fld, expected, actual, message)
            return
        if si is None:
            si = len(steps) - 1
        step = steps[si]
        row = next((r for r in step.rows if r.seq_id == seq_id), None)
        row = row or next((r for r in step.rows if r.write_seq == seq_id), None)
        self.findings.flag(si, step, row or stub_row(seq_id), ACCOUNTING, fld, expected, actual, message, about=seq_id)


def check_nothing_after_eos(flag: RowFlags, history: History) -> None:
    """Nothing follows an EOS in one step's emitted tokens; the EOS ends the sequence there."""
    row = flag.row
    eos_at = next((i for i, token in enumerate(row.emitted) if token in history.eos), None)
    if eos_at is None:
        return
    after = row.emitted[eos_at + 1 :]
    if after:
        flag(
            ACCOUNTING,
            "emitted",
            "nothing after EOS",
            after,
            f"{len(after)} token(s) emitted after EOS in the same step",
        )
    # An EOS ends the sequence wherever it sits: anything later is "decoded again".
    seq = history.seqs[row.write_seq]
    if seq.finished_at is None:
        seq.finished_at = flag.si


def check_row_reason(flag: RowFlags, history: History, received: list[int]) -> None:
    """The row's `finished` / `finish_reason` agree with each other and with what the sequence received."""
    row, si = flag.row, flag.si
    seq = history.seqs[row.seq_id]
    if seq.finished_at is not None and seq.finished_at < si:
        return  # decoded after it finished: token accounting already says so
    allowed = allowed_endings(received, seq.written, seq.budget, history.eos) if received else set()
    reason = row.finish_reason
    if row.finished != (reason is not None):
        flag(
            ACCOUNTING,
            "finished",
            reason is not None,
            row.finished,
            f"finished is {row.finished} but finish_reason is {reason!r}",
        )
    if reason is None and allowed:
        expected = "eos" if "eos" in allowed else "length"
        flag(
            ACCOUNTING,
            "finish_reason",
            expected,
            None,
            f"sequence {row.seq_id} ended at this step ({_why(allowed, seq.written)}) but the row records no finish",
        )
    elif reason is not None and reason not in allowed:
        flag(
            ACCOUNTING,
            "finish_reason",
            sorted(allowed) or None,
            reason,
            _wrong_reason(reason, row.seq_id, received, seq.written, seq.budget),
        )
    if (reason is not None or allowed) and seq.finished_at is None:
        seq.finished_at = si  # a claimed ending too: the sequence must not come back


def _why(allowed: set[str], written: int) -> str:
    return "EOS" if "eos" in allowed else f"{written} tokens, the budget"


def _wrong_reason(reason: str, seq_id: int, tokens: list[int], written: int, max_new: int) -> str:
    if reason == "eos":
        last = tokens[-1] if tokens else None
        return f"finish_reason 'eos' for sequence {seq_id}, but its last token {last} is not an EOS id"
    return f"finish_reason 'length' for sequence {seq_id} with {written} of {max_new} tokens"
