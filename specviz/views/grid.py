"""The ragged grid of one verify step, drawn as the paper draws it: rows = batch rows, columns =
slots (the cache slots fed to the verify pass, the query slots, one bonus column).

What each slot holds and why it differs from a correct engine is computed in
`specviz.analysis.slots`; this module only draws it (colours, positions as text, outlines, hovers)
and words it (the step's violations, a row's fed vs expected fields).
"""

from __future__ import annotations

import plotly.graph_objects as go

from specviz.analysis.slots import RowSlots, Slot, StepSlots
from specviz.views.palette import (
    FIRST_FLAG_COLOR,
    FLAG_COLOR,
    KIND_COLORS,
    KIND_LABELS,
    KINDS,
    discrete_colorscale,
    kind_code,
)
from specviz.views.safe_text import html_text
from specviz.views.tokens import token_label

DEFAULT_WINDOW = 40  # cache slots shown; the query and bonus columns are always shown
MAX_COLUMNS = 1024  # columns drawn at most (the window slider stops at 512 cache slots, the query at 257)
MAX_TEXT_COLUMNS = 90  # beyond this many columns the position text is unreadable: hover only
NO_ROW = -1  # the row picker's "none"
ROW_PX = 30
TOP_PX = 60  # title, region labels, slot numbers (fixed: plotly's automargin would take more)
DESYNC_LABEL_PX = 92  # the right margin that holds "desync begins here"
NARROW_DESYNC_LABEL_PX = 58
CACHE_LABEL_EVERY = 5  # a wide window labels every 5th cache slot: numbers stay horizontal and apart


# ----------------------------------------------------------------------------- figure


def window_start(grid: StepSlots, window: int, focus_col: int | None = None) -> int:
    """First cache column shown: the last `window` cache slots, widened to include `focus_col`."""
    start = max(0, grid.cache_len - max(window, 1))
    if focus_col is not None and focus_col < start:
        start = max(0, focus_col - 2)
    return start


def drawn_columns(grid: StepSlots, window: int) -> range:
    """The columns the grid draws at `window`: never wider than what was built (a huge cache or
    batch builds fewer columns per row), widened to the step's first violation."""
    focus = grid.first_violation[1] if grid.first_violation else None
    built = min((r.slots.first for r in grid.rows), default=0)
    # Never past MAX_COLUMNS: a cell costs ~300 bytes sent.
    return range(max(window_start(grid, window, focus), built, grid.width - MAX_COLUMNS), grid.width)


def _hover(grid_row: RowSlots, cell: Slot, texts: dict[int, str], cache_len: int, query_len: int) -> str:
    if cell.col < cache_len:
        where = f"cache slot {cell.col}"
    elif cell.col < cache_len + query_len:
        j = cell.col - cache_len
        where = "query slot 0 (pending)" if j == 0 else f"query slot {j} (draft {j})"
    else:
        where = "bonus column (not fed this step)"
    lines = [f"<b>row {grid_row.row} · seq {grid_row.seq_id}</b> · {where}", KIND_LABELS[cell.kind]]
    if cell.token is not None:
        label = html_text(repr(token_label(texts, cell.token)), 80)  # trace text: plotly renders HTML
        lines.append(f"token {cell.token} {label} (index {cell.token_index})")
    if cell.kind == "bonus":
        lines.append(f"fed next step as the pending token, at position {cell.expected_position}")
    elif cell.expected_position is not None:
        if cell.position_recorded:
            lines.append(f"fed position {cell.fed_position} · expected {cell.expected_position}")
        else:
            lines.append(f"expected position {cell.expected_position} (prefill: not recorded)")
    lines += [f"<span style='color:{FLAG_COLOR}'>✗ {html_text(reason, 300)}</span>" for reason in cell.reasons]
    return "<br>".join(lines)


def _cell_text(cell: Slot) -> str:
    if cell.kind == "bonus":
        return "+1"
    if cell.fed_position is None:
        return ""
    return str(cell.fed_position) if cell.position_recorded else f"<i>{cell.fed_position}</i>"


def _row_label(grid_row: RowSlots, hidden_flags: int, selected: bool, flagged: bool, short: bool = False) -> str:
    """`row r · seq s`; short (a phone's grid): `r r·s s`, so the cells keep the width."""
    label = f"r{grid_row.row}·s{grid_row.seq_id}" if short else f"row {grid_row.row} · seq {grid_row.seq_id}"
    if hidden_flags and not short:
        label += f" (+{hidden_flags} ✗ left)"
    if flagged:
        label = f"<span style='color:{FLAG_COLOR}'><b>✗ {label}</b></span>"
    return f"▶ {label}" if selected else label


def _column_labels(grid: StepSlots, start: int) -> list[str]:
    """Slot numbers over the columns; a window of many cache slots labels every 5th (and its last)."""
    every = CACHE_LABEL_EVERY if grid.cache_len - start > 12 else 1
    labels = [str(j) if j % every == 0 or j == grid.cache_len - 1 else "" for j in range(start, grid.cache_len)]
    labels += ["pend"] + [f"d{j}" for j in range(1, grid.query_len)]
    return labels + ["bonus"]


def grid_figure(
    grid: StepSlots,
    texts: dict[int, str] | None = None,
    window: int = DEFAULT_WINDOW,
    selected_row: int | None = None,
    title: str | None = None,
    note: str = "",
) -> go.Figure:
    """Plotly figure of a step grid: coloured kinds, fed positions as text, red outlines for errors.

    `grid` holds the rows drawn (a page of the step's, `views.run.row_page`); `note` says which.
    """
    texts = texts or {}
    focus = grid.first_violation[1] if grid.first_violation else None
    drawn = drawn_columns(grid, window)
    columns, start = list(drawn), drawn.start
    z, text, hover, labels, short_labels = [], [], [], [], []
    outlines: list[tuple[int, int]] = []
    # `RowSlots.flagged` scans every built slot of the row: asked once per row here, not four times.
    flags = [grid_row.flagged for grid_row in grid.rows]
    for y, grid_row in enumerate(grid.rows):
        shown = [grid_row.slots[c] for c in columns]
        z.append([kind_code(c.kind) for c in shown])
        text.append([_cell_text(c) for c in shown])
        hover.append([_hover(grid_row, c, texts, grid.cache_len, grid.query_len) for c in shown])
        outlines += [(y, x) for x, c in enumerate(shown) if c.flagged]
        hidden = sum(c.flagged for c in grid_row.slots[:start])
        selected = grid_row.row == selected_row
        labels.append(_row_label(grid_row, hidden, selected, flags[y]))
        short_labels.append(_row_label(grid_row, hidden, selected, flags[y], short=True))
    # The heatmap as a dict: plotly validates its cells once (a `go.Heatmap` given to `go.Figure` is
    # validated again from its properties: twice the cost, a third of a step move on a 128-row step).
    heatmap = {
        "type": "heatmap",
        "z": z,
        "text": text,
        "customdata": hover,
        "texttemplate": "%{text}" if len(columns) <= MAX_TEXT_COLUMNS else None,
        "textfont": {"size": 10},
        "hovertemplate": "%{customdata}<extra></extra>",
        "colorscale": discrete_colorscale(),
        "zmin": -0.5,
        "zmax": len(KINDS) - 0.5,
        "showscale": False,
        "xgap": 1,
        "ygap": 2,
    }
    fig = go.Figure(data=[heatmap])
    _add_outlines(fig, outlines, FLAG_COLOR, 2)
    _mark_first_violation(fig, grid, columns, text)
    _mark_selected_row(fig, grid, selected_row, len(columns))
    _add_column_headers(fig, grid, start, len(columns))
    has_label = grid.first_violation is not None and grid.row_position(grid.first_violation[0]) is not None
    full_title = title or _default_title(grid, start, sum(flags))
    full_title += f"<br><sup>{html_text(note)}</sup>" if note else ""
    # The legend is HTML under the plot (`legend_html`): it wraps on a phone, a plotly legend does not.
    fig.update_layout(
        title={
            "text": full_title,
            "x": 0,
            "xref": "container",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 4, "l": 4},
            "font": {"size": 14},
        },
        height=TOP_PX + 8 + ROW_PX * max(len(grid.rows), 1),
        margin={"l": 10, "r": DESYNC_LABEL_PX if has_label else 10, "t": TOP_PX, "b": 8},
        plot_bgcolor="white",
        showlegend=False,
        hoverlabel={"align": "left"},
        meta={"sv_grid": _fit_meta(grid, columns, focus, (labels, short_labels), full_title, has_label, sum(flags))},
    )
    fig.update_xaxes(
        tickvals=list(range(len(columns))),
        ticktext=_column_labels(grid, start),
        tickfont={"size": 9},
        tickangle=0,  # never vertical: a turned number runs into the region labels above it
        automargin=False,
        side="top",
        showgrid=False,
        zeroline=False,
        range=[-0.5, len(columns) - 0.5],
    )
    fig.update_yaxes(
        tickvals=list(range(len(grid.rows))),
        ticktext=labels,
        automargin=True,  # the left margin is as wide as the row labels, no wider
        autorange="reversed",
        showgrid=False,
        zeroline=False,
    )
    return fig


def _fit_meta(
    grid: StepSlots,
    columns: list[int],
    focus: int | None,
    row_labels: tuple[list[str], list[str]],
    title: str,
    has_label: bool,
    flagged: int,
) -> dict[str, object]:
    """What the page's script (assets.GRID_FIT_JS) needs to refit the grid to a narrow container:
    the relayout for narrow and the one that restores the wide layout. On a phone the grid shows the
    query and the last cache slots at a readable size (drag to pan), with short row labels."""
    focus_x = columns.index(focus) if focus is not None and focus in columns else None
    labels, short_labels = row_labels
    short_title = f"<b>Step {grid.step.step}</b> · " + (
        f"<span style='color:{FLAG_COLOR}'>{flagged} of {len(grid.rows)} rows differ</span>"
        if flagged
        else "all rows as expected"
    )
    query_x = grid.cache_len - columns[0] if columns else 0
    return {
        "columns": len(columns),
        "cols": columns,  # a click's x index -> the slot it shows (the details panel asks for it)
        "rows": [grid_row.row for grid_row in grid.rows],  # a click's y index -> the batch row
        "query_x": query_x,
        "focus_x": focus_x,
        "narrow": {
            "title.text": short_title,
            "yaxis.ticktext": short_labels,
            "margin.r": NARROW_DESYNC_LABEL_PX if has_label else 10,
            "dragmode": "pan",
        },
        "wide": {
            "title.text": title,
            "yaxis.ticktext": labels,
            "margin.r": DESYNC_LABEL_PX if has_label else 10,
            "dragmode": "zoom",
            "xaxis.range": [-0.5, len(columns) - 0.5],
        },
    }


def _default_title(grid: StepSlots, start: int, flagged: int) -> str:
    step = grid.step
    parts = [f"<b>Step {step.step}</b>", f"batch {step.batch_id}", f"{len(step.rows)} rows"]
    parts.append(f"cache {step.cache_len} slots" + (f" (showing the last {step.cache_len - start})" if start else ""))
    parts.append(f"query {step.query_len} slots")
    if step.grouped is not None:
        parts.append("equal-length group" if step.grouped else "padded fallback batch")
    parts.append(
        f"<span style='color:{FLAG_COLOR}'>{flagged} row(s) differ from expected</span>"
        if flagged
        else "all rows as expected"
    )
    return " · ".join(parts)


def legend_items(grid: StepSlots, selected_row: int | None = None) -> list[tuple[str, str]]:
    """(swatch style, label) for every kind and mark this step shows, and only those."""
    present = {c.kind for r in grid.rows for c in r.slots}
    items = [
        (f"background:{KIND_COLORS[kind]};border:1px solid #94a3b8", KIND_LABELS[kind])
        for kind in KINDS
        if kind in present and kind != "empty"
    ]
    if any(c.flagged for r in grid.rows for c in r.slots):
        items.append((f"border:2px solid {FLAG_COLOR}", "fed ≠ expected"))
    if grid.first_violation is not None and grid.row_position(grid.first_violation[0]) is not None:
        items.append((f"background:{FIRST_FLAG_COLOR}", "desync begins here: the run's first violation"))
    if selected_row is not None and grid.row_position(selected_row) is not None:
        items.append(("border:1.5px dotted #0f172a", "dotted frame: the highlighted row (fed vs expected below)"))
    return items


def legend_html(grid: StepSlots, selected_row: int | None = None) -> str:
    """The grid's legend as HTML under the plot: entries wrap between each other, never inside one."""
    entries = "".join(
        f"<span class='sv-legend-item'><span class='sv-swatch' style='{style}'></span>{html_text(label, 120)}</span>"
        for style, label in legend_items(grid, selected_row)
    )
    return f"<div class='sv-legend'>{entries}</div>"


def _add_outlines(fig: go.Figure, cells: list[tuple[int, int]], color: str, width: int) -> None:
    """All outlines as one line trace of None-separated squares: one shape per cell costs seconds."""
    if not cells:
        return
    xs: list[float | None] = []
    ys: list[float | None] = []
    h = 0.46  # a little inside the cell, so neighbouring outlines stay distinct
    for y, x in cells:
        xs += [x - h, x + h, x + h, x - h, x - h, None]
        ys += [y - h, y - h, y + h, y + h, y - h, None]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            line={"color": color, "width": width},
            hoverinfo="skip",
            showlegend=False,
            name="differs from expected",
        )
    )


def _mark_first_violation(fig: go.Figure, grid: StepSlots, columns: list[int], text: list[list[str]]) -> None:
    """The run's first violation: its cell filled dark red (its number in white on top), labelled."""
    if grid.first_violation is None:
        return
    row, col = grid.first_violation
    y = grid.row_position(row)
    if y is None:
        return
    x = columns.index(col) if col in columns else 0
    fig.add_shape(
        type="rect",
        x0=x - 0.5,
        x1=x + 0.5,
        y0=y - 0.5,
        y1=y + 0.5,
        line={"color": FIRST_FLAG_COLOR, "width": 4},
        fillcolor=FIRST_FLAG_COLOR,
    )
    # Shapes cover the heatmap's text: the cell's own number goes back on top, in white.
    number = text[y][x] if y < len(text) and x < len(text[y]) else ""
    if number and len(columns) <= MAX_TEXT_COLUMNS:
        fig.add_annotation(
            x=x, y=y, text=f"<b>{number}</b>", showarrow=False, font={"color": "white", "size": 10}, name="first-cell"
        )
    # The label sits in the right margin, level with its row; its arrow ends at the row's right
    # edge, so neither covers a cell (the dark red cell says which one).
    fig.add_annotation(
        x=len(columns) - 0.5,
        y=y,
        ax=len(columns) + 0.2,
        ay=y,
        axref="x",
        ayref="y",
        xanchor="left",
        text="<b>desync<br>begins here</b>",
        name="desync-label",
        showarrow=True,
        arrowhead=2,
        arrowwidth=1.5,
        arrowcolor=FIRST_FLAG_COLOR,
        font={"color": "white", "size": 11},
        bgcolor=FIRST_FLAG_COLOR,
    )


def _mark_selected_row(fig: go.Figure, grid: StepSlots, selected_row: int | None, width: int) -> None:
    y = grid.row_position(selected_row) if selected_row is not None else None
    if y is None:
        return
    fig.add_shape(
        type="rect",
        x0=-0.5,
        x1=width - 0.5,
        y0=y - 0.5,
        y1=y + 0.5,
        line={"color": "#0f172a", "width": 1.5, "dash": "dot"},
        fillcolor="rgba(0,0,0,0)",
    )


def _add_column_headers(fig: go.Figure, grid: StepSlots, start: int, width: int) -> None:
    """Brackets over the cache, query and bonus regions, and a divider before the query."""
    query_x = grid.cache_len - start
    fig.add_vline(x=query_x - 0.5, line={"color": "#0f172a", "width": 2})
    # The bonus column needs no region label: its own column label says "bonus".
    cache_label = f"cache slots {start}..{grid.cache_len - 1}" + (" (window)" if start else "")
    regions = [
        ("region-cache", (query_x - 1) / 2, cache_label),
        ("region-query", query_x + (grid.query_len - 1) / 2, "verify query"),
    ]
    for name, x, label in regions:
        if query_x == 0 and name == "region-cache":
            continue
        fig.add_annotation(
            x=x, y=1.0, yref="paper", yshift=24, text=f"<b>{label}</b>", showarrow=False, font={"size": 11}, name=name
        )


# ----------------------------------------------------------------------------- text
