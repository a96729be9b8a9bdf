"""The ragged grid of one step in words: the row picker's choices, a row's fed vs expected table,
the step's violations. Moved out of grid.py (the figure), unchanged.
"""

from __future__ import annotations

from specviz.analysis.report import Violation
from specviz.analysis.slots import StepSlots
from specviz.trace.schema import StepRecord
from specviz.views.grid import NO_ROW
from specviz.views.safe_text import md_text
from specviz.views.tokens import token_label


def row_choices(step: StepRecord) -> list[tuple[str, int]]:
    """(label, row) pairs for a row picker: "none" first, then every batch row of the step (the
    grid draws a page of them: picking one opens its page)."""
    return [("none", NO_ROW)] + [(f"row {r.row} · seq {r.seq_id}", r.row) for r in step.rows]


def _tokens(texts: dict[int, str], tokens: list[int]) -> str:
    return (
        " ".join(f"{t} {md_text(repr(token_label(texts, t)), 80)}" if t in texts else str(t) for t in tokens) or "none"
    )


def row_details_markdown(grid: StepSlots, row: int, texts: dict[int, str] | None = None) -> str:
    """Fed vs expected for one row, field by field, as a markdown table."""
    texts = texts or {}
    grid_row = grid.find_row(row)
    if grid_row is None:
        return ""
    rec, expected = grid_row.record, grid_row.expected
    n = rec.committed_before
    lines = [
        f"**Row {rec.row} · sequence {rec.seq_id}** (n = {n} committed tokens incl. the pending one)",
        "",
        "| field | fed | expected |",
        "|---|---|---|",
        _line("left padding", rec.left_pad, expected.left_pad),
        _line("attended cache slots (kv_len)", rec.kv_len, expected.kv_len),
        _line("query positions", rec.position_ids, expected.position_ids),
        _line("written to sequence", rec.write_seq, expected.write_seq),
        f"| drafts | {_tokens(texts, rec.draft_tokens)} | |",
        f"| target argmax | {_tokens(texts, rec.target_tokens)} | |",
        f"| accepted | {rec.accepted} | |",
        f"| emitted | {_tokens(texts, rec.emitted)} | |",
    ]
    if rec.draft_kv_len is not None:
        lines.insert(6, _line("draft cache slots", rec.draft_kv_len, expected.kv_len))
    for note in grid_row.notes:
        lines.append(f"\n⚠️ {note}")
    return "\n".join(lines)


def _line(name: str, fed: object, expected: object) -> str:
    mark = "" if fed == expected else " ✗"
    return f"| {name} | {fed}{mark} | {expected} |"


def step_markdown(grid: StepSlots, violations: list[Violation] | None = None) -> str:
    """The violations of this step in words, one line per violation (capped); `violations`: the
    whole step's (default: those of the rows drawn)."""
    found = [v for r in grid.rows for v in r.violations] if violations is None else violations
    if not found:
        return f"Step {grid.step.step}: every row as expected."
    lines = [f"**Step {grid.step.step}: {len(found)} violation(s)**"]
    for v in found[:12]:
        what = f"invariant {int(v.invariant)} *{md_text(v.name)}*: {md_text(v.message, 300)}"
        lines.append(f"- row {int(v.row)} (seq {int(v.seq_id)}), {what}")
    if len(found) > 12:
        lines.append(f"- … and {len(found) - 12} more (Invariants tab)")
    return "\n".join(lines)
