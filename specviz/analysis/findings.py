"""What the checker has found so far: violations, skipped checks, and where each sequence first broke.

`Findings` collects; `RowFlags` is `Findings.flag` bound once to one (step, row), so a check reads

    flag(Invariant.POSITIONS, "position_ids", expected, row.position_ids, "positions start at ...")

A violation about a sequence that no row of the located step holds sits at a stub row (`NO_ROW`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specviz.analysis.report import Violation
from specviz.trace.invariants import Invariant
from specviz.trace.schema import RowRecord, StepRecord

MAX_REPORTED_VIOLATIONS = 10_000  # `violation_count` still counts them all
NO_ROW = -1  # the violation is about a sequence that no row of that step holds
RUN = -1  # step index of a violation located at a run with no steps at all


@dataclass
class Findings:
    """Violations (the first MAX_REPORTED_VIOLATIONS), their count, and the checks that could not run."""

    violations: list[Violation] = field(default_factory=list)
    count: int = 0  # every violation found, reported or not
    skipped: set[str] = field(default_factory=set)  # notes: checks that could not run, and why
    first_bad_step: dict[int, int] = field(default_factory=dict)  # seq_id -> first step index touching it
    recorded: set[str] = field(default_factory=set)  # optional state fields that some row records

    def flag(
        self,
        si: int,
        step: StepRecord,
        row: RowRecord,
        invariant: Invariant,
        fld: str,
        expected: Any,
        actual: Any,
        message: str,
    ) -> None:
        """A violation at step index `si`, touching the row's own sequence and its write target."""
        self.count += 1
        for seq_id in {row.seq_id, row.write_seq}:
            if seq_id not in self.first_bad_step:
                self.first_bad_step[seq_id] = si
        if len(self.violations) < MAX_REPORTED_VIOLATIONS:
            self.violations.append(
                Violation(step.step, si, row.row, row.seq_id, invariant, invariant.slug, fld, expected, actual, message)
            )

    def flag_run(self, seq_id: int, invariant: Invariant, fld: str, expected: Any, actual: Any, message: str) -> None:
        """A violation of a run with no steps at all: step -1, row -1."""
        self.count += 1
        self.first_bad_step.setdefault(seq_id, RUN)
        self.violations.append(
            Violation(RUN, RUN, NO_ROW, seq_id, invariant, invariant.slug, fld, expected, actual, message)
        )

    def skip(self, note: str) -> None:
        self.skipped.add(note)

    def at(self, si: int, step: StepRecord, row: RowRecord) -> RowFlags:
        return RowFlags(self, si, step, row)


@dataclass(frozen=True)
class RowFlags:
    """`Findings.flag` bound to one row of one step: `flag(invariant, field, expected, actual, message)`."""

    findings: Findings
    si: int  # index into trace.steps
    step: StepRecord
    row: RowRecord

    def __call__(self, invariant: Invariant, fld: str, expected: Any, actual: Any, message: str) -> None:
        self.findings.flag(self.si, self.step, self.row, invariant, fld, expected, actual, message)

    def skip(self, note: str) -> None:
        self.findings.skip(note)


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
