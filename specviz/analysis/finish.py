"""Finish reasons and run completeness: every prompt accounted for, every ending justified.

Endings are derived from the token history the checker reconstructs, never from what the engine
says about itself:
- a row's `finish_reason` is "eos" only if its sequence received an EOS token at that step, and
  "length" only if the sequence reached exactly `max_new_tokens` then (both are allowed when the
  last token of the budget is an EOS); a sequence that ended and whose row says nothing is flagged;
- nothing may follow an EOS inside one step's emitted tokens;
- a sequence's own `finish_reason` must agree with its `output_ids`;
- in a run marked complete, every sequence must have been scheduled and must have finished.
A sequence that was never decoded is located at the run (the last step, row -1, or step -1 when
the run has no steps at all); one that was dropped is located at the last step that held it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specviz.analysis.report import INVARIANTS, Violation
from specviz.trace.schema import RowRecord, StepRecord

if TYPE_CHECKING:
    from specviz.analysis.check import _Checker

ACCOUNTING = 4  # token-accounting: endings are part of what a sequence was given
NO_ROW = -1  # the violation is about a sequence that no row of that step holds


def records_row_finish(steps: list[StepRecord]) -> bool:
    """Row finish fields are optional: a trace in which no row records one did not record them."""
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
    """Finish-reason and completeness checks, fed by the main checker as it walks the steps."""

    def __init__(self, chk: _Checker) -> None:
        self.chk = chk
        self.records_finish = records_row_finish(chk.trace.steps)
        self.last_seen: dict[int, int] = {}  # seq_id -> last step index holding or receiving it

    # ------------------------------------------------------------------ per step

    def check_step(self, si: int, step: StepRecord) -> None:
        """Called after the step's writes were applied to the checker's sequence states."""
        received: dict[int, list[int]] = {}
        for row in step.rows:
            self.last_seen[row.seq_id] = si
            self.last_seen[row.write_seq] = si
            received.setdefault(row.write_seq, []).extend(row.emitted)
            self._check_nothing_after_eos(si, step, row)
        if not self.records_finish:
            self.chk.skipped.add("row finish reasons: no row records finished / finish_reason")
            return
        for row in step.rows:
            self._check_row_reason(si, step, row, received.get(row.seq_id, []))

    def _check_nothing_after_eos(self, si: int, step: StepRecord, row: RowRecord) -> None:
        eos_at = next((i for i, token in enumerate(row.emitted) if token in self.chk.eos), None)
        if eos_at is None:
            return
        after = row.emitted[eos_at + 1 :]
        if after:
            self.chk.flag(
                si,
                step,
                row,
                ACCOUNTING,
                "emitted",
                "nothing after EOS",
                after,
                f"{len(after)} token(s) emitted after EOS in the same step",
            )
        # An EOS ends the sequence wherever it sits: anything later is "decoded again".
        state = self.chk.seqs[row.write_seq]
        if state.finished_at is None:
            state.finished_at = si

    def _check_row_reason(self, si: int, step: StepRecord, row: RowRecord, received: list[int]) -> None:
        chk = self.chk
        state = chk.seqs[row.seq_id]
        if state.finished_at is not None and state.finished_at < si:
            return  # decoded after it finished: token accounting already says so
        allowed = allowed_endings(received, state.written, chk.max_new, chk.eos) if received else set()
        reason = row.finish_reason
        if row.finished != (reason is not None):
            chk.flag(
                si,
                step,
                row,
                ACCOUNTING,
                "finished",
                reason is not None,
                row.finished,
                f"finished is {row.finished} but finish_reason is {reason!r}",
            )
        if reason is None and allowed:
            expected = "eos" if "eos" in allowed else "length"
            chk.flag(
                si,
                step,
                row,
                ACCOUNTING,
                "finish_reason",
                expected,
                None,
                f"sequence {row.seq_id} ended at this step ({_why(allowed, state.written)}) but the row records "
                "no finish",
            )
        elif reason is not None and reason not in allowed:
            chk.flag(
                si,
                step,
                row,
                ACCOUNTING,
                "finish_reason",
                sorted(allowed) or None,
                reason,
                _wrong_reason(reason, row.seq_id, received, state.written, chk.max_new),
            )
        if (reason is not None or allowed) and state.finished_at is None:
            state.finished_at = si  # a claimed ending too: the sequence must not come back

    # ------------------------------------------------------------------ per sequence, end of run

    def check_run(self) -> None:
        chk = self.chk
        complete = chk.trace.header.complete
        for seq in chk.trace.sequences:
            state = chk.seqs[seq.seq_id]
            last = self.last_seen.get(seq.seq_id)
            if complete and last is None and chk.max_new > 0:
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
                    f"sequence {seq.seq_id} left the batch unfinished ({state.written} of {chk.max_new} tokens, "
                    "no EOS) in a run marked complete",
                )
                continue
            self._check_sequence_reason(seq, state, last, complete)

    def _check_sequence_reason(self, seq: Any, state: Any, last: int | None, complete: bool) -> None:
        chk = self.chk
        where = state.touched_steps[-1] if state.touched_steps else last
        allowed = allowed_endings(seq.output_ids[-1:], len(seq.output_ids), chk.max_new, chk.eos)
        reason = seq.finish_reason
        if reason is None and complete:
            self._flag(
                where,
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
                _wrong_reason(reason, seq.seq_id, seq.output_ids[-1:], len(seq.output_ids), chk.max_new),
            )

    def _flag(self, si: int | None, seq_id: int, fld: str, expected: Any, actual: Any, message: str) -> None:
        """A sequence-level violation at step index `si`, or at the run when `si` is None."""
        chk = self.chk
        steps = chk.trace.steps
        if si is None and not steps:
            _flag_without_steps(chk, seq_id, fld, expected, actual, message)
            return
        if si is None:
            si = len(steps) - 1
        step = steps[si]
        row = next((r for r in step.rows if r.seq_id == seq_id), None)
        row = row or next((r for r in step.rows if r.write_seq == seq_id), None)
        chk.flag(si, step, row or stub_row(seq_id), ACCOUNTING, fld, expected, actual, message)


def _why(allowed: set[str], written: int) -> str:
    return "EOS" if "eos" in allowed else f"{written} tokens, the budget"


def _wrong_reason(reason: str, seq_id: int, tokens: list[int], written: int, max_new: int) -> str:
    if reason == "eos":
        last = tokens[-1] if tokens else None
        return f"finish_reason 'eos' for sequence {seq_id}, but its last token {last} is not an EOS id"
    return f"finish_reason 'length' for sequence {seq_id} with {written} of {max_new} tokens"


def stub_row(seq_id: int) -> RowRecord:
    """Stands for a sequence that no row of the located step holds."""
    return RowRecord(
        row=NO_ROW,
        seq_id=seq_id,
        committed_before=0,
        left_pad=0,
        left_pad_after=None,
        pending_token=0,
        draft_tokens=[],
        target_tokens=[],
        accepted=0,
        bonus=None,
        emitted=[],
        write_seq=seq_id,
        position_ids=[],
        mask_rle=[],
        kv_len=0,
        kv_len_expected=0,
    )


def _flag_without_steps(chk: _Checker, seq_id: int, fld: str, expected: Any, actual: Any, message: str) -> None:
    """A run with no steps at all: the violation sits at step -1 (the run), row -1."""
    chk.count += 1
    chk.first_bad_step.setdefault(seq_id, -1)
    chk.violations.append(
        Violation(-1, -1, NO_ROW, seq_id, ACCOUNTING, INVARIANTS[ACCOUNTING], fld, expected, actual, message)
    )
