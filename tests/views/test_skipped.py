"""The skipped-check lines the app shows next to the verdict."""

from __future__ import annotations

from specviz.analysis.report import Report, SkippedCheck
from specviz.views.skipped import skipped_lines, skipped_markdown


def report(*skipped: SkippedCheck) -> Report:
    return Report("clean", [], [], 1.0, 1e-3, list(skipped))


def test_partial_skips_come_first_and_say_how_many_steps() -> None:
    layout = SkippedCheck("rectangular alignment", "the trace declares no left-padded layout", 22, 22)
    draft = SkippedCheck("draft", "the draft calls were not found", 11, 22)
    lines = skipped_lines(report(layout, draft))
    assert lines[0] == "draft checks skipped on 11 of 22 steps: the draft calls were not found"
    assert lines[1].startswith("rectangular alignment checks skipped on the whole run")
    assert skipped_markdown(report()) == "" and skipped_markdown(report(draft)).startswith("- draft checks")
    assert "draft" in draft and draft.to_dict() == {
        "check": "draft",
        "reason": "the draft calls were not found",
        "steps": 11,
        "of": 22,
    }
