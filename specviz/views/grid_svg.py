"""The ragged grid of one verify step as a standalone SVG string: what the HTML report embeds.

The same cells as the app's plotly grid (`specviz.views.grid`): one row per batch row, the last
cache slots, the query slots, the bonus column; colours by kind, the fed position as text, a red
outline where fed differs from expected, the run's first violation filled dark red. Each cell
carries its facts as an SVG <title> (a tooltip with no script). No script, no external resource,
every trace string escaped.
"""

from __future__ import annotations

from specviz.analysis.slots import StepSlots
from specviz.views.details import cell_facts
from specviz.views.grid import DEFAULT_WINDOW, window_start
from specviz.views.palette import FIRST_FLAG_COLOR, FLAG_COLOR, KIND_COLORS
from specviz.views.safe_text import html_text

CELL_W, CELL_H = 26, 22
LABEL_W, TOP_H = 118, 34
SVG_COLUMNS = 300  # columns drawn at most: each cell carries its facts (~600 bytes)


def _column_label(grid: StepSlots, col: int, start: int) -> str:
    if col < grid.cache_len:
        every = 5 if grid.cache_len - start > 12 else 1
        return str(col) if col % every == 0 or col == grid.cache_len - 1 else ""
    j = col - grid.cache_len
    if j < grid.query_len:
        return "pend" if j == 0 else f"d{j}"
    return "bonus"


def grid_svg(grid: StepSlots, texts: dict[int, str], window: int = DEFAULT_WINDOW) -> str:
    """The step's grid (the rows `grid` holds) as an <svg> element (inline in HTML): `window` cache
    slots, widened to the first violation but never past SVG_COLUMNS columns in all."""
    focus = grid.first_violation[1] if grid.first_violation else None
    built = min((r.slots.first for r in grid.rows), default=0)
    start = max(window_start(grid, window, focus), built, grid.width - SVG_COLUMNS)
    columns = list(range(start, grid.width))
    width = LABEL_W + CELL_W * len(columns) + 4
    height = TOP_H + CELL_H * len(grid.rows) + 4
    parts = [
        f"<svg class='sv-grid-svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-family='ui-sans-serif, system-ui, sans-serif' role='img' "
        f"aria-label='ragged grid of step {grid.step.step}'>"
    ]
    for x, col in enumerate(columns):
        label = _column_label(grid, col, start)
        if label:
            cx = LABEL_W + CELL_W * x + CELL_W / 2
            parts.append(f"<text x='{cx:.1f}' y='{TOP_H - 8}' font-size='9' text-anchor='middle'>{label}</text>")
    query_x = LABEL_W + CELL_W * (grid.cache_len - start)
    parts.append(
        f"<line x1='{query_x}' y1='{TOP_H - 20}' x2='{query_x}' y2='{height - 2}' stroke='#0f172a' stroke-width='2'/>"
    )
    parts.append(f"<text x='{query_x + 4}' y='{TOP_H - 22}' font-size='10' font-weight='700'>verify query</text>")
    if start < grid.cache_len:
        parts.append(
            f"<text x='{LABEL_W}' y='{TOP_H - 22}' font-size='10' font-weight='700'>"
            f"cache slots {start}..{grid.cache_len - 1}</text>"
        )
    for y, grid_row in enumerate(grid.rows):
        top = TOP_H + CELL_H * y
        first_here = grid.first_violation is not None and grid.first_violation[0] == grid_row.row
        color = f" fill='{FLAG_COLOR}' font-weight='700'" if grid_row.flagged else ""
        parts.append(
            f"<text x='4' y='{top + CELL_H * 0.68:.1f}' font-size='11'{color}>"
            f"{'✗ ' if grid_row.flagged else ''}row {grid_row.row} · seq {grid_row.seq_id}</text>"
        )
        for x, col in enumerate(columns):
            if col < grid_row.slots.first:
                continue
            cell = grid_row.slots[col]
            left = LABEL_W + CELL_W * x
            first_cell = first_here and grid.first_violation[1] == col
            fill = FIRST_FLAG_COLOR if first_cell else KIND_COLORS[cell.kind]
            stroke = f" stroke='{FLAG_COLOR}' stroke-width='2'" if cell.flagged else ""
            facts = cell_facts(grid, grid_row.row, col, texts) or []
            title = html_text("; ".join(f"{name}: {value}" for name, value in facts), 600)
            parts.append(
                f"<g><title>{title}</title><rect x='{left + 1}' y='{top + 1}' width='{CELL_W - 2}' "
                f"height='{CELL_H - 2}' fill='{fill}'{stroke}/>"
            )
            text = "+1" if cell.kind == "bonus" else ("" if cell.fed_position is None else str(cell.fed_position))
            if text:
                style = " font-style='italic'" if not cell.position_recorded else ""
                ink = "#ffffff" if first_cell else "#0f172a"
                parts.append(
                    f"<text x='{left + CELL_W / 2:.1f}' y='{top + CELL_H * 0.68:.1f}' font-size='9' "
                    f"text-anchor='middle' fill='{ink}'{style}>{text}</text>"
                )
            parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)
