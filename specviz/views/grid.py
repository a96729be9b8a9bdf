"""The ragged grid of one verify step, as the paper draws it: rows = batch rows, columns = slots.

Columns are the `cache_len` cache slots fed to the verify pass, then its `query_len` query slots
(the pending token and the k drafts), then one column for the bonus token. Everything is
reconstructed from what the trace says was *fed* (mask_rle, position_ids, committed_before,
draft_tokens, accepted) and compared with what a correct left-padded engine would have fed:

- a correct row's cache is `0^pad 1^(n-1)`: padding, then its n-1 committed tokens;
- an attended slot beyond those n-1 tokens is *extra* (stale KV, absorbed padding);
- a masked slot after the first attended one is a *hole*;
- a slot whose fed position differs from its token index is wrong (RoPE sees another place).

The trace records how many slots a row attends, not which token each physical slot holds. When a
row attends more slots than it has committed tokens, the surplus is drawn as the attended slots
next to the query (where stale drafts sit right after they go stale, and where the default window
looks): the count is exact, the place is a convention, and the hover says so.

Cache slots were fed in earlier steps: their fed position is the one recorded when their token
was a query slot (pending or accepted draft). Prompt tokens before the last were prefilled, which
the trace does not record, so their expected position stands in and the hover says so.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import plotly.graph_objects as go

from specviz.analysis.report import Report, Violation
from specviz.trace.schema import RowRecord, SequenceRecord, StepRecord, Trace
from specviz.views.palette import (
    FIRST_FLAG_COLOR,
    FLAG_COLOR,
    KIND_COLORS,
    KIND_LABELS,
    KINDS,
    discrete_colorscale,
    kind_code,
)
from specviz.views.tokens import token_label

DEFAULT_WINDOW = 40  # cache slots shown; the query and bonus columns are always shown
MAX_TEXT_COLUMNS = 90  # beyond this many columns the position text is unreadable: hover only

# Violation fields whose evidence sits in the cache slots, the query slots, or the output.
CACHE_FIELDS = ("mask_rle", "kv_len", "left_pad")
OUTPUT_FIELDS = ("write_seq", "emitted", "output_ids")

# (seq_id, token index) -> [(step index, fed position)], ordered by step index.
FedHistory = dict[tuple[int, int], list[tuple[int, int]]]


@dataclass
class Cell:
    col: int  # 0..cache_len-1 cache, then query slots, then the bonus column
    kind: str  # one of palette.KINDS
    token: int | None = None
    token_index: int | None = None  # index in prompt + output of the row's sequence
    fed_position: int | None = None
    expected_position: int | None = None
    position_recorded: bool = True  # False for prefilled prompt tokens (not in the trace)
    reasons: list[str] = field(default_factory=list)  # why this cell differs from expected

    @property
    def flagged(self) -> bool:
        return bool(self.reasons)


@dataclass
class GridRow:
    row: int
    seq_id: int
    committed_before: int
    accepted: int
    cells: list[Cell]
    violations: list[Violation]
    notes: list[str]  # row-level facts that have no cell (e.g. KV of missing tokens)
    record: RowRecord

    @property
    def flagged(self) -> bool:
        return bool(self.violations) or any(c.flagged for c in self.cells)

    def kinds(self) -> list[str]:
        return [c.kind for c in self.cells]


@dataclass
class StepGrid:
    step_index: int
    step: StepRecord
    rows: list[GridRow]
    first_violation: tuple[int, int] | None  # (row, col) of the run's first violation, if here

    @property
    def cache_len(self) -> int:
        return self.step.cache_len

    @property
    def query_len(self) -> int:
        return self.step.query_len

    @property
    def width(self) -> int:
        return self.cache_len + self.query_len + 1  # + bonus column

    def row(self, row: int) -> GridRow:
        return next(r for r in self.rows if r.row == row)


# ----------------------------------------------------------------------------- reconstruction


def fed_history(trace: Trace) -> FedHistory:
    """Where each token's KV was computed: the position fed when it was a kept query slot."""
    history: FedHistory = {}
    for si, step in enumerate(trace.steps):
        for row in step.rows:
            base = row.committed_before - 1
            kept = min(max(row.accepted, 0) + 1, len(row.position_ids))
            for j in range(kept):
                history.setdefault((row.seq_id, base + j), []).append((si, row.position_ids[j]))
    return history


def _fed_before(history: FedHistory, seq_id: int, index: int, step_index: int) -> int | None:
    entries = history.get((seq_id, index))
    if not entries:
        return None
    at = bisect.bisect_left(entries, (step_index, -(10**12)))
    return entries[at - 1][1] if at > 0 else None


def expand_mask(mask_rle: list[list[int]], width: int) -> list[int | None]:
    """The fed mask row as a list of `width` entries; None where the mask is too short."""
    values: list[int | None] = []
    for value, count in mask_rle:
        values.extend([value] * count)
    if len(values) < width:
        values.extend([None] * (width - len(values)))
    return values[:width]


def _cache_cells(
    step: StepRecord,
    row: RowRecord,
    mask: list[int | None],
    tokens: list[int],
    prompt_len: int,
    history: FedHistory,
    step_index: int,
) -> tuple[list[Cell], list[str]]:
    expected_kv = max(row.committed_before - 1, 0)
    attended = [j for j in range(step.cache_len) if mask[j] == 1]
    extra = max(0, len(attended) - expected_kv)
    held = len(attended) - extra  # attended slots that hold committed tokens
    # Token index held by the first attended slot; > 0 when the KV of old tokens is missing.
    first_index = expected_kv - held
    rank = {slot: i for i, slot in enumerate(attended)}
    first_attended = attended[0] if attended else step.cache_len
    notes = []
    if first_index > 0:
        notes.append(f"the cache lacks the KV of {first_index} committed token(s)")
    cells = []
    for j in range(step.cache_len):
        if mask[j] is None:
            cells.append(Cell(j, "empty", reasons=["the fed mask is shorter than cache + query"]))
        elif mask[j] == 0:
            cells.append(_masked_cell(j, j > first_attended))
        elif rank[j] >= held:
            cells.append(_extra_cell(j, len(attended), expected_kv))
        else:
            index = first_index + rank[j]
            cells.append(_cached_token_cell(j, index, tokens, prompt_len, row.seq_id, history, step_index))
    return cells, notes


def _masked_cell(col: int, inside: bool) -> Cell:
    if not inside:
        return Cell(col, "padding")
    return Cell(col, "hole", reasons=["masked slot inside the row (a hole after the first real slot)"])


def _extra_cell(col: int, attended: int, expected: int) -> Cell:
    return Cell(
        col,
        "extra",
        reasons=[
            f"the row attends {attended} cache slots but holds {expected} committed tokens: "
            f"{attended - expected} extra (stale KV or absorbed padding). The count is exact; which slots "
            "they are is not recorded, so they are drawn next to the query"
        ],
    )


def _cached_token_cell(
    col: int, index: int, tokens: list[int], prompt_len: int, seq_id: int, history: FedHistory, step_index: int
) -> Cell:
    fed = _fed_before(history, seq_id, index, step_index)
    cell = Cell(
        col,
        "prompt" if index < prompt_len else "committed",
        token=tokens[index] if 0 <= index < len(tokens) else None,
        token_index=index,
        fed_position=fed if fed is not None else index,
        expected_position=index,
        position_recorded=fed is not None,
    )
    if fed is not None and fed != index:
        cell.reasons.append(f"its KV was computed at position {fed}, expected {index}")
    return cell


def _query_cells(step: StepRecord, row: RowRecord, mask: list[int | None]) -> list[Cell]:
    start = row.committed_before - 1
    cells = []
    for j in range(step.query_len):
        col = step.cache_len + j
        if j == 0:
            kind, token = "pending", row.pending_token
        else:
            token = row.draft_tokens[j - 1] if j - 1 < len(row.draft_tokens) else None
            kind = "accepted" if j <= row.accepted else "rejected"
        fed = row.position_ids[j] if j < len(row.position_ids) else None
        cell = Cell(col, kind, token=token, token_index=start + j, fed_position=fed, expected_position=start + j)
        if fed is None:
            cell.reasons.append("no position ID recorded for this query slot")
        elif fed != start + j:
            cell.reasons.append(f"fed position {fed}, expected {start + j}")
        if mask[col] == 0:
            cell.reasons.append("query slot not attended by the fed mask")
        if kind == "accepted" and j - 1 < len(row.target_tokens) and token != row.target_tokens[j - 1]:
            cell.reasons.append(f"accepted although the target predicted {row.target_tokens[j - 1]}")
        cells.append(cell)
    return cells


def _bonus_cell(step: StepRecord, row: RowRecord) -> Cell:
    col = step.cache_len + step.query_len
    if row.bonus is None:
        return Cell(col, "empty")
    index = row.committed_before + row.accepted
    return Cell(col, "bonus", token=row.bonus, token_index=index, expected_position=index)


def _anchor_col(cells: list[Cell], violation: Violation, step: StepRecord) -> int:
    """The cell that shows a violation best: its own evidence if drawn, else the row's key cell."""
    query_start = step.cache_len
    bonus = step.cache_len + step.query_len
    if violation.field == "position_ids":
        candidates = [c for c in cells[query_start:bonus] if c.flagged]
    elif violation.field in CACHE_FIELDS:
        # The rightmost flagged cache slot: it is inside the default window.
        candidates = [c for c in reversed(cells[:query_start]) if c.flagged]
    elif violation.field in ("accepted",):
        candidates = [c for c in cells[query_start:bonus] if c.kind == "accepted" and c.flagged]
    else:
        candidates = []
    if candidates:
        return candidates[0].col
    if violation.field in OUTPUT_FIELDS:
        return bonus
    return query_start if query_start < len(cells) else max(len(cells) - 1, 0)


def build_row(
    trace: Trace,
    step_index: int,
    row: RowRecord,
    history: FedHistory,
    violations: list[Violation],
) -> GridRow:
    step = trace.steps[step_index]
    seq = _sequence(trace, row.seq_id)
    tokens = seq.prompt_ids + seq.output_ids if seq else []
    prompt_len = len(seq.prompt_ids) if seq else 0
    mask = expand_mask(row.mask_rle, step.cache_len + step.query_len)
    cells, notes = _cache_cells(step, row, mask, tokens, prompt_len, history, step_index)
    cells += _query_cells(step, row, mask)
    cells.append(_bonus_cell(step, row))
    for violation in violations:
        anchor = cells[_anchor_col(cells, violation, step)]
        if violation.message not in anchor.reasons:
            anchor.reasons.append(violation.message)
    return GridRow(row.row, row.seq_id, row.committed_before, row.accepted, cells, violations, notes, row)


def _sequence(trace: Trace, seq_id: int) -> SequenceRecord | None:
    for seq in trace.sequences:
        if seq.seq_id == seq_id:
            return seq
    return None


def step_grid(
    trace: Trace, step_index: int, report: Report | None = None, history: FedHistory | None = None
) -> StepGrid:
    """The reconstructed grid of `trace.steps[step_index]`; pass `history` to reuse it across steps."""
    if not 0 <= step_index < len(trace.steps):
        raise IndexError(f"step index {step_index} outside 0..{len(trace.steps) - 1}")
    history = history if history is not None else fed_history(trace)
    step = trace.steps[step_index]
    here = [v for v in report.violations if v.step_index == step_index] if report else []
    rows = [build_row(trace, step_index, r, history, [v for v in here if v.row == r.row]) for r in step.rows]
    first = report.first_violation if report else None
    first_cell = None
    if first is not None and first.step_index == step_index:
        grid_row = next((g for g in rows if g.row == first.row), None)
        if grid_row is not None:
            first_cell = (first.row, _anchor_col(grid_row.cells, first, step))
    return StepGrid(step_index, step, rows, first_cell)


# ----------------------------------------------------------------------------- figure


def window_start(grid: StepGrid, window: int, focus_col: int | None = None) -> int:
    """First cache column shown: the last `window` cache slots, widened to include `focus_col`."""
    start = max(0, grid.cache_len - max(window, 1))
    if focus_col is not None and focus_col < start:
        start = max(0, focus_col - 2)
    return start


def _hover(grid_row: GridRow, cell: Cell, texts: dict[int, str], cache_len: int, query_len: int) -> str:
    if cell.col < cache_len:
        where = f"cache slot {cell.col}"
    elif cell.col < cache_len + query_len:
        j = cell.col - cache_len
        where = "query slot 0 (pending)" if j == 0 else f"query slot {j} (draft {j})"
    else:
        where = "bonus column (not fed this step)"
    lines = [f"<b>row {grid_row.row} · seq {grid_row.seq_id}</b> · {where}", KIND_LABELS[cell.kind]]
    if cell.token is not None:
        lines.append(f"token {cell.token} {token_label(texts, cell.token)!r} (index {cell.token_index})")
    if cell.kind == "bonus":
        lines.append(f"fed next step as the pending token, at position {cell.expected_position}")
    elif cell.expected_position is not None:
        if cell.position_recorded:
            lines.append(f"fed position {cell.fed_position} · expected {cell.expected_position}")
        else:
            lines.append(f"expected position {cell.expected_position} (prefill: not recorded)")
    lines += [f"<span style='color:{FLAG_COLOR}'>✗ {reason}</span>" for reason in cell.reasons]
    return "<br>".join(lines)


def _cell_text(cell: Cell) -> str:
    if cell.kind == "bonus":
        return "+1"
    if cell.fed_position is None:
        return ""
    return str(cell.fed_position) if cell.position_recorded else f"<i>{cell.fed_position}</i>"


def _row_label(grid_row: GridRow, hidden_flags: int, selected: bool) -> str:
    label = f"row {grid_row.row} · seq {grid_row.seq_id}"
    if hidden_flags:
        label += f" (+{hidden_flags} ✗ left)"
    if grid_row.flagged:
        label = f"<span style='color:{FLAG_COLOR}'><b>✗ {label}</b></span>"
    return f"▶ {label}" if selected else label


def _column_labels(grid: StepGrid, start: int) -> list[str]:
    labels = [str(j) for j in range(start, grid.cache_len)]
    labels += ["pend"] + [f"d{j}" for j in range(1, grid.query_len)]
    return labels + ["bonus"]


def grid_figure(
    grid: StepGrid,
    texts: dict[int, str] | None = None,
    window: int = DEFAULT_WINDOW,
    selected_row: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Plotly figure of a step grid: coloured kinds, fed positions as text, red outlines for errors."""
    texts = texts or {}
    focus = grid.first_violation[1] if grid.first_violation else None
    start = window_start(grid, window, focus)
    columns = list(range(start, grid.width))
    z, text, hover, labels = [], [], [], []
    outlines: list[tuple[int, int]] = []
    for y, grid_row in enumerate(grid.rows):
        shown = [grid_row.cells[c] for c in columns]
        z.append([kind_code(c.kind) for c in shown])
        text.append([_cell_text(c) for c in shown])
        hover.append([_hover(grid_row, c, texts, grid.cache_len, grid.query_len) for c in shown])
        outlines += [(y, x) for x, c in enumerate(shown) if c.flagged]
        hidden = sum(c.flagged for c in grid_row.cells[:start])
        labels.append(_row_label(grid_row, hidden, grid_row.row == selected_row))
    fig = go.Figure(
        go.Heatmap(
            z=z,
            text=text,
            customdata=hover,
            texttemplate="%{text}" if len(columns) <= MAX_TEXT_COLUMNS else None,
            textfont={"size": 10},
            hovertemplate="%{customdata}<extra></extra>",
            colorscale=discrete_colorscale(),
            zmin=-0.5,
            zmax=len(KINDS) - 0.5,
            showscale=False,
            xgap=1,
            ygap=2,
        )
    )
    _add_legend(fig, grid)
    _add_outlines(fig, outlines, FLAG_COLOR, 2)
    _mark_first_violation(fig, grid, columns)
    _mark_selected_row(fig, grid, selected_row, len(columns))
    _add_column_headers(fig, grid, start, len(columns))
    height = 150 + 30 * max(len(grid.rows), 1)
    fig.update_layout(
        title={"text": title or _default_title(grid, start), "x": 0, "font": {"size": 14}},
        height=height,
        margin={"l": 10, "r": 100 if grid.first_violation else 10, "t": 90, "b": 40},
        plot_bgcolor="white",
        legend={"orientation": "h", "y": -0.02, "yanchor": "top", "x": 0, "font": {"size": 11}},
        hoverlabel={"align": "left"},
    )
    fig.update_xaxes(
        tickvals=list(range(len(columns))),
        ticktext=_column_labels(grid, start),
        tickfont={"size": 9},
        side="top",
        showgrid=False,
        zeroline=False,
        range=[-0.5, len(columns) - 0.5],
    )
    fig.update_yaxes(
        tickvals=list(range(len(grid.rows))),
        ticktext=labels,
        autorange="reversed",
        showgrid=False,
        zeroline=False,
    )
    return fig


def _default_title(grid: StepGrid, start: int) -> str:
    step = grid.step
    parts = [f"<b>Step {step.step}</b>", f"batch {step.batch_id}", f"{len(grid.rows)} rows"]
    parts.append(f"cache {step.cache_len} slots" + (f" (showing the last {step.cache_len - start})" if start else ""))
    parts.append(f"query {step.query_len} slots")
    if step.grouped is not None:
        parts.append("equal-length group" if step.grouped else "padded fallback batch")
    flagged = sum(r.flagged for r in grid.rows)
    parts.append(
        f"<span style='color:{FLAG_COLOR}'>{flagged} row(s) differ from expected</span>"
        if flagged
        else "all rows as expected"
    )
    return " · ".join(parts)


def _add_legend(fig: go.Figure, grid: StepGrid) -> None:
    """Dummy traces: heatmaps have no per-category legend. Only kinds present are listed."""
    present = {c.kind for r in grid.rows for c in r.cells}
    for kind in KINDS:
        if kind in present and kind != "empty":
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="markers",
                    name=KIND_LABELS[kind],
                    marker={
                        "symbol": "square",
                        "size": 12,
                        "color": KIND_COLORS[kind],
                        "line": {"width": 1, "color": "#94a3b8"},
                    },
                    hoverinfo="skip",
                )
            )
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            name="fed ≠ expected",
            marker={"symbol": "square-open", "size": 12, "color": FLAG_COLOR, "line": {"width": 2}},
            hoverinfo="skip",
        )
    )


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


def _mark_first_violation(fig: go.Figure, grid: StepGrid, columns: list[int]) -> None:
    if grid.first_violation is None:
        return
    row, col = grid.first_violation
    y = next(i for i, r in enumerate(grid.rows) if r.row == row)
    x = columns.index(col) if col in columns else 0
    fig.add_shape(
        type="rect",
        x0=x - 0.5,
        x1=x + 0.5,
        y0=y - 0.5,
        y1=y + 0.5,
        line={"color": FIRST_FLAG_COLOR, "width": 4},
        fillcolor="rgba(220,38,38,0.35)",
    )
    # The label sits in the right margin, level with its row, so it hides no cell of the window.
    fig.add_annotation(
        x=x,
        y=y,
        ax=len(columns) + 0.2,
        ay=y,
        axref="x",
        ayref="y",
        xanchor="left",
        text="<b>desync<br>begins here</b>",
        showarrow=True,
        arrowhead=2,
        arrowwidth=1.5,
        arrowcolor=FIRST_FLAG_COLOR,
        font={"color": "white", "size": 11},
        bgcolor=FIRST_FLAG_COLOR,
    )


def _mark_selected_row(fig: go.Figure, grid: StepGrid, selected_row: int | None, width: int) -> None:
    ys = [i for i, r in enumerate(grid.rows) if r.row == selected_row]
    if not ys:
        return
    fig.add_shape(
        type="rect",
        x0=-0.5,
        x1=width - 0.5,
        y0=ys[0] - 0.5,
        y1=ys[0] + 0.5,
        line={"color": "#0f172a", "width": 1.5, "dash": "dot"},
        fillcolor="rgba(0,0,0,0)",
    )


def _add_column_headers(fig: go.Figure, grid: StepGrid, start: int, width: int) -> None:
    """Brackets over the cache, query and bonus regions, and a divider before the query."""
    query_x = grid.cache_len - start
    fig.add_vline(x=query_x - 0.5, line={"color": "#0f172a", "width": 2})
    regions = [
        ((query_x - 1) / 2, f"cache slots {start}..{grid.cache_len - 1}" + (" (window)" if start else "")),
        (query_x + (grid.query_len - 1) / 2, "verify query"),
        (width - 1, "bonus"),
    ]
    for x, label in regions:
        if query_x == 0 and label.startswith("cache"):
            continue
        fig.add_annotation(
            x=x, y=1.0, yref="paper", yshift=28, text=f"<b>{label}</b>", showarrow=False, font={"size": 11}
        )


# ----------------------------------------------------------------------------- text


def _tokens(texts: dict[int, str], tokens: list[int]) -> str:
    return " ".join(f"{t} `{token_label(texts, t)}`" if t in texts else str(t) for t in tokens) or "none"


def row_details_markdown(grid: StepGrid, row: int, texts: dict[int, str] | None = None) -> str:
    """Fed vs expected for one row, field by field, as a markdown table."""
    texts = texts or {}
    grid_row = next((r for r in grid.rows if r.row == row), None)
    if grid_row is None:
        return ""
    rec = grid_row.record
    n = rec.committed_before
    expected_positions = list(range(n - 1, n - 1 + grid.query_len))
    expected_pad = max(grid.cache_len - (n - 1), 0)
    lines = [
        f"**Row {rec.row} · sequence {rec.seq_id}** (n = {n} committed tokens incl. the pending one)",
        "",
        "| field | fed | expected |",
        "|---|---|---|",
        _line("left padding", rec.left_pad, expected_pad),
        _line("attended cache slots (kv_len)", rec.kv_len, n - 1),
        _line("query positions", rec.position_ids, expected_positions),
        _line("written to sequence", rec.write_seq, rec.seq_id),
        f"| drafts | {_tokens(texts, rec.draft_tokens)} | |",
        f"| target argmax | {_tokens(texts, rec.target_tokens)} | |",
        f"| accepted | {rec.accepted} | |",
        f"| emitted | {_tokens(texts, rec.emitted)} | |",
    ]
    if rec.draft_kv_len is not None:
        lines.insert(6, _line("draft cache slots", rec.draft_kv_len, n - 1))
    for note in grid_row.notes:
        lines.append(f"\n⚠️ {note}")
    return "\n".join(lines)


def _line(name: str, fed: object, expected: object) -> str:
    mark = "" if fed == expected else " ✗"
    return f"| {name} | {fed}{mark} | {expected} |"


def step_markdown(grid: StepGrid) -> str:
    """The violations of this step in words, one line per violation (capped)."""
    found = [v for r in grid.rows for v in r.violations]
    if not found:
        return f"Step {grid.step.step}: every row as expected."
    lines = [f"**Step {grid.step.step}: {len(found)} violation(s)**"]
    for v in found[:12]:
        lines.append(f"- row {v.row} (seq {v.seq_id}), invariant {v.invariant} *{v.name}*: {v.message}")
    if len(found) > 12:
        lines.append(f"- … and {len(found) - 12} more (Invariants tab)")
    return "\n".join(lines)
