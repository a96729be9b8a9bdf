"""What the checker has found so far: violations, skipped checks, and where each sequence first broke.

`Findings` collects; `RowFlags` is `Findings.flag` bound once to one (step, row), so a check reads

    flag(Invariant.POSITIONS, "position_ids", expected, row.position_ids, "positions start at ...")

A violation about a sequence that no row of the located step holds sits at a stub row (`NO_ROW`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from specviz.analysis.budgets import BUDGETS  # noqa: F401  (its old home: importers of findings.BUDGETS)
from specviz.analysis.report import SkippedCheck, Violation

# Re-exported: the watch and the tests name these from here (they live below the metrics now).
from specviz.analysis.unread import UNFOLLOWED, UNFOLLOWED_CHECK
from specviz.analysis.unread import UNREADABLE as UNREADABLE
from specviz.analysis.unread import unreadable_from as unreadable_from
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
    # (check, reason) -> step indices where it could not run (RUN: the whole run)
    skipped: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    seen: set[tuple[Any, ...]] = field(default_factory=set)  # each violation is reported once
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
        about: int | None = None,
    ) -> None:
        """A violation at step index `si`, touching the row's own sequence and its write target.

        `about` names the sequence a sequence-level violation is about when it is located at
        another sequence's row (the row that fed it); by default the row's own sequence. Two checks
        that reach the same conclusion (same row, sequence, invariant, field, values) report it once.
        """
        seq_id = row.seq_id if about is None else about
        key = (si, row.row, seq_id, invariant, fld, repr(expected), repr(actual))
        if key in self.seen:
            return
        self.seen.add(key)
        self.count += 1
        for touched in (row.seq_id, row.write_seq, seq_id):
            self.first_bad_step.setdefault(touched, si)
        if len(self.violations) < MAX_REPORTED_VIOLATIONS:
            self.violations.append(
                Violation(step.step, si, row.row, seq_id, invariant, invariant.slug, fld, expected, actual, message)
            )

    def flag_run(self, seq_id: int, invariant: Invariant, fld: str, expected: Any, actual: Any, message: str) -> None:
        """A violation of a run with no steps at all: step -1, row -1."""
        self.count += 1
        self.first_bad_step.setdefault(seq_id, RUN)
        self.violations.append(
            Violation(RUN, RUN, NO_ROW, seq_id, invariant, invariant.slug, fld, expected, actual, message)
        )

    def skip(self, check: str, reason: str, si: int = RUN) -> None:
        """`check` could not run at step index `si` (default: anywhere in the run) because `reason`."""
        self.skipped.setdefault((check, reason), set()).add(si)

    def skip_steps(self, check: str, reason: str, step_indices: Iterable[int]) -> None:
        """`check` could not run at these step indices (none: nothing noted)."""
        indices = set(map(int, step_indices))
        if indices:
            self.skipped.setdefault((check, reason), set()).update(indices)

    def note_unfollowed(self, options: dict[str, Any]) -> None:
        """The checks of the calls a watched run's reading stopped before (`UNFOLLOWED`)."""
        for reason in options.get(UNFOLLOWED) or ():
            self.skip(UNFOLLOWED_CHECK, str(reason))

    def skipped_checks(self, steps: int) -> list[SkippedCheck]:
        """What could not run, with the number of steps it missed out of `steps`."""
        out = []
        for (check, reason), where in sorted(self.skipped.items()):
            count = steps if RUN in where else len(where)
            out.append(SkippedCheck(check, reason, count, steps))
        return out

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

    def skip(self, check: str, reason: str) -> None:
        """`check` could not run on this row's step."""
        self.findings.skip(check, reason, self.si)


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
