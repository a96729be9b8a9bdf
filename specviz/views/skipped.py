"""The checks a report could not run, as lines to show next to the verdict (pure, no UI).

    skipped_markdown(report)  # "- draft checks skipped on 11 of 22 steps: ..." or ""

A check that could not run is not a pass: the app shows these under the verdict badge.
"""

from __future__ import annotations

from specviz.analysis.report import Report, SkippedCheck
from specviz.views.safe_text import md_text

# Checks every watched trace skips by construction: listed, but after the ones that matter.
BY_LAYOUT = ("rectangular alignment",)


def skipped_lines(report: Report) -> list[str]:
    """One plain-text line per skipped check, partial skips (some steps) first."""
    ordered = sorted(report.skipped_checks, key=_order)
    return [str(s) for s in ordered]


def skipped_markdown(report: Report) -> str:
    """A Markdown bullet list of `skipped_lines` (text from the trace escaped), or "" if none."""
    return "\n".join(f"- {md_text(line)}" for line in skipped_lines(report))


def _order(skipped: SkippedCheck) -> tuple[int, int, str]:
    partial = 0 if skipped.steps < skipped.of else 1
    return (skipped.check in BY_LAYOUT, partial, skipped.check)
