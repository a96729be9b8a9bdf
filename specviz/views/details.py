"""One cell of the ragged grid in words: what the app's details panel and the HTML report show.

A cell is (row, column) of one verify step (`specviz.analysis.slots`): the facts are the row, its
sequence, where the slot sits, what it holds, the position fed and the one a correct engine feeds,
and every invariant the row breaks at this step with what that invariant means. Every string
from the trace (token text) is escaped here: the trace is untrusted.
"""

from __future__ import annotations

from specviz.analysis.slots import RowSlots, Slot, StepSlots
from specviz.trace.invariants import Invariant
from specviz.views.palette import FLAG_COLOR, KIND_LABELS
from specviz.views.safe_text import html_text
from specviz.views.tokens import token_label

# What each invariant means, for a reader who has not read docs/forensics.md.
INVARIANT_EXPLAINED: dict[int, str] = {
    int(Invariant.ALIGNMENT): "every row of a left-padded batch has one width, its padding first then its tokens",
    int(Invariant.POSITIONS): "the token at logical index j is fed at position j; the verify block of a row "
    "with n committed tokens sits at n-1 .. n-1+k",
    int(Invariant.KV): "the attended cache slots hold exactly the row's committed tokens, less the pending one",
    int(Invariant.ACCOUNTING): "0 <= accepted <= drafted, emitted = accepted + bonus, written to the row's own "
    "sequence; a finished sequence never comes back",
    int(Invariant.OUTPUT): "each output equals the target's batch-1 greedy decoding",
}


def where_text(grid: StepSlots, col: int) -> str:
    """The slot's place in words: a cache slot, a query slot (pending or draft j), the bonus column."""
    if col < grid.cache_len:
        return f"cache slot {col}"
    if col < grid.cache_len + grid.query_len:
        j = col - grid.cache_len
        return "query slot 0 (pending token)" if j == 0 else f"query slot {j} (draft {j})"
    return "bonus column (fed next step)"


def focus_col(grid_row: RowSlots, grid: StepSlots, drawn: range | None = None) -> int:
    """The cell a row's details open on: its first flagged slot (of the `drawn` columns, when the
    grid draws a window), else its pending query slot."""
    flagged = next((slot.col for slot in grid_row.slots if slot.flagged and (drawn is None or slot.col in drawn)), None)
    return flagged if flagged is not None else grid.cache_len


def cell_facts(grid: StepSlots, row: int, col: int, texts: dict[int, str]) -> list[tuple[str, str]] | None:
    """(name, value) lines of one cell, plain text (not escaped); None when the cell is not drawn."""
    grid_row = grid.find_row(row)
    if grid_row is None or not grid_row.slots.first <= col < grid.width:
        return None
    cell: Slot = grid_row.slots[col]
    facts = [
        ("step", f"{grid.step.step} (index {grid.step_index})"),
        ("row", f"{grid_row.row} · sequence {grid_row.seq_id}"),
        ("slot", where_text(grid, col)),
        ("holds", KIND_LABELS[cell.kind]),
    ]
    if cell.token is not None:
        facts.append(("token", f"{cell.token} {token_label(texts, cell.token)!r} (index {cell.token_index})"))
    if cell.kind == "bonus":
        facts.append(("position", f"fed next step at {cell.expected_position}"))
    elif cell.expected_position is not None:
        fed = cell.fed_position if cell.position_recorded else "not recorded (prefill)"
        facts.append(("position fed", str(fed)))
        facts.append(("position expected", str(cell.expected_position)))
    facts += [("differs", reason) for reason in cell.reasons]
    return facts


def row_invariants(grid: StepSlots, row: int) -> list[tuple[str, str]]:
    """(invariant, what it means · what the row fed) per invariant the row breaks at this step."""
    grid_row = grid.find_row(row)
    if grid_row is None:
        return []
    found: dict[tuple[int, str], list[str]] = {}
    for v in grid_row.violations:
        found.setdefault((int(v.invariant), v.name), []).append(v.message)
    return [
        (f"{number} {name}", f"{INVARIANT_EXPLAINED.get(number, '')}. Here: " + "; ".join(messages))
        for (number, name), messages in found.items()
    ]


def cell_details_html(grid: StepSlots, row: int, col: int, texts: dict[int, str]) -> str:
    """The details panel of one cell: its facts and the row's broken invariants, escaped. The panel
    carries its cell as data attributes (the page's keys move from it)."""
    facts = cell_facts(grid, row, col, texts)
    if facts is None:
        return ""
    lines = "".join(
        f"<tr><th>{html_text(name)}</th><td{_flag(name)}>{html_text(value, 400)}</td></tr>" for name, value in facts
    )
    broken = row_invariants(grid, row)
    invariants = "".join(
        f"<li><b>invariant {html_text(name)}</b>: {html_text(text, 600)}</li>" for name, text in broken
    )
    tail = (
        f"<p>This row breaks at this step:</p><ul>{invariants}</ul>"
        if broken
        else "<p>No invariant broken by this row at this step.</p>"
    )
    return (
        f"<div class='sv-cell' data-row='{int(row)}' data-col='{int(col)}' data-step='{int(grid.step_index)}'>"
        f"<b>Cell details</b> (Esc closes; h / l move along the row)"
        f"<table class='sv-cell-facts'>{lines}</table>{tail}</div>"
    )


def _flag(name: str) -> str:
    return f" style='color:{FLAG_COLOR}'" if name == "differs" else ""
