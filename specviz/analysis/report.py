"""What the forensics conclude about a trace: violations, per-sequence verdicts, run verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from specviz.trace.invariants import Invariant

if TYPE_CHECKING:
    from specviz.analysis.metrics import StepTotals

# Run verdicts, worst last. `desync` wins over `unexplained` because a broken invariant explains.
# `unreadable`: a watched run whose calls could not be mapped from some step on; never clean, and
# a violation in the steps before it still makes the run a desync.
RUN_VERDICTS = ("clean", "numerical", "unreadable", "unexplained", "desync")


@dataclass
class Violation:
    step: int  # StepRecord.step
    step_index: int  # index into trace.steps
    row: int  # batch row within that step
    seq_id: int
    invariant: Invariant  # written to JSON as its number
    name: str  # invariant.slug
    field: str  # the trace field that shows it, e.g. "position_ids"
    expected: Any
    actual: Any
    message: str  # one line, human readable

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["invariant"] = int(self.invariant)  # a plain int in JSON and in dicts
        return out


@dataclass
class SequenceVerdict:
    seq_id: int
    first_divergence: int | None  # token index, None if exact (or no reference)
    # "exact" | "desync" | "numerical" | "unexplained" | "no-reference" | "unread" (an unreadable
    # run's unfinished sequence that agrees with its reference as far as it was read)
    verdict: str
    divergence_step: int | None  # step that emitted the divergent token
    margin: float | None  # reference top-1 minus top-2 logit at the divergent token
    first_violation_step: int | None  # earliest violation touching this sequence
    context_output: list[int] = field(default_factory=list)  # a few tokens around the divergence
    context_reference: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SkippedCheck:
    """A check that could not run on some steps (or on the whole run), and why."""

    check: str  # "draft", "greedy acceptance", "KV content", ...
    reason: str
    steps: int  # steps where it could not run
    of: int  # steps in the run

    def __str__(self) -> str:
        where = "the whole run" if self.steps >= self.of else f"{self.steps} of {self.of} steps"
        return f"{self.check} checks skipped on {where}: {self.reason}"

    def __contains__(self, text: str) -> bool:
        """`"mask_rle" in skipped`: reads like its text line."""
        return text in str(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    verdict: str  # one of RUN_VERDICTS
    violations: list[Violation]  # ordered by (step_index, row, invariant)
    sequences: list[SequenceVerdict]
    exact_match: float | None
    margin_threshold: float
    skipped_checks: list[SkippedCheck]  # checks that could not run, on how many steps, and why
    violation_count: int = 0  # before truncation of `violations` (huge broken traces)
    # {"step": S, "why": ...}: the watch read no call from step S on (`findings.unreadable_from`)
    unreadable: dict[str, Any] | None = None
    # Where `unreadable`: the exact match of what was read (steps before its step), which is all
    # that can be said; `exact_match` is then None (the whole outputs were not read).
    exact_match_read: float | None = None
    # {"sequences": N, "tokens": M}: through the command, last steps no later call fed back, read
    # as the target's choices, not seen (`unread.read_as_greedy`); None: every token was seen.
    read_as_greedy: dict[str, int] | None = None
    # The metrics' sums, gathered by the check's own walk (a Parquet trace is read once for both);
    # not part of the report's JSON.
    totals: StepTotals | None = field(default=None, repr=False, compare=False)

    @property
    def first_violation(self) -> Violation | None:
        return self.violations[0] if self.violations else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "exact_match": self.exact_match,
            "first_violation": self.first_violation.to_dict() if self.first_violation else None,
            "violation_count": self.violation_count,
            "violations": [v.to_dict() for v in self.violations],
            "sequences": [s.to_dict() for s in self.sequences],
            "margin_threshold": self.margin_threshold,
            "skipped_checks": [s.to_dict() for s in self.skipped_checks],
            "unreadable": self.unreadable,
            "exact_match_read": self.exact_match_read,
            "read_as_greedy": self.read_as_greedy,
        }


def exact_read_note(report: Report) -> str | None:
    """Where the run is unreadable from step S: what its exact match can say, in a phrase (the
    outputs past S were never read, so only the steps before S are compared). None otherwise."""
    if report.unreadable is None:
        return None
    step = report.unreadable["step"]
    if report.exact_match_read is None or step <= 0:
        return f"unknown (outputs unread from step {step})"
    exact = sum(s.verdict in ("exact", "unread") for s in report.sequences)
    return (
        f"unknown (outputs unread from step {step}); over the steps read (0..{step - 1}): "
        f"{exact}/{len(report.sequences)} prompts agree so far"
    )
