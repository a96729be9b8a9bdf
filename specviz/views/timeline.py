"""The invariant timeline (violations by step and invariant) and the table that jumps to them."""

from __future__ import annotations

import textwrap
from collections import Counter

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from specviz.analysis.report import Report
from specviz.trace.invariants import STATE_INVARIANTS
from specviz.trace.schema import Trace
from specviz.views.palette import FIRST_FLAG_COLOR, FLAG_COLOR, OK_COLOR

MAX_TABLE_ROWS = 500  # the table is for jumping; the timeline shows them all
VIOLATION_COLUMNS = ["step", "row", "seq", "invariant", "field", "expected", "actual", "message"]


def _short(value: object, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def violations_table(report: Report, limit: int = MAX_TABLE_ROWS) -> pd.DataFrame:
    """One line per violation, in order; the first line is where desync begins."""
    rows = [
        (
            v.step,
            v.row,
            v.seq_id,
            f"{v.invariant} {v.name}",
            v.field,
            _short(v.expected),
            _short(v.actual),
            v.message,
        )
        for v in report.violations[:limit]
    ]
    return pd.DataFrame(rows, columns=VIOLATION_COLUMNS)


def timeline_figure(trace: Trace, report: Report) -> go.Figure:
    """Markers at (step, invariant) sized by count; the first violation starred and labelled."""
    fig = go.Figure()
    counts = Counter((v.step, v.invariant) for v in report.violations)
    messages: dict[tuple[int, int], str] = {}
    firsts: dict[tuple[int, int], int] = {}  # index of each marker's first violation: a click opens it
    for i, v in enumerate(report.violations):
        messages.setdefault((v.step, v.invariant), _wrapped(f"row {v.row}, seq {v.seq_id}: {v.message}"))
        firsts.setdefault((v.step, v.invariant), i)
    if counts:
        keys = sorted(counts)
        fig.add_trace(
            go.Scatter(
                x=[s for s, _ in keys],
                y=[int(i) for _, i in keys],
                mode="markers",
                name="violations",
                marker={
                    "color": FLAG_COLOR,
                    "size": [min(6 + 2 * counts[k], 22) for k in keys],
                    "opacity": 0.75,
                    "line": {"width": 0},
                },
                customdata=_customdata(keys, counts, messages, firsts),
                hovertemplate="step %{x} · %{customdata[0]} violation(s)<br>first: %{customdata[1]}"
                "<br><i>click to open it in the grid</i><extra></extra>",
            )
        )
    _mark_first(fig, report)
    title = _title(trace, report)
    last_step = trace.steps[-1].step if trace.steps else 0
    fig.update_layout(
        title={"text": title, "x": 0, "font": {"size": 14}},
        height=300,
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
        plot_bgcolor="white",
        showlegend=False,
    )
    fig.update_xaxes(title_text="step", range=[-0.5, last_step + 0.5], showgrid=True, gridcolor="#f1f5f9")
    fig.update_yaxes(
        tickvals=[int(i) for i in STATE_INVARIANTS],
        ticktext=[f"{int(i)} {i.slug}" for i in STATE_INVARIANTS],
        range=[max(STATE_INVARIANTS) + 0.6, min(STATE_INVARIANTS) - 0.4],
        showgrid=True,
        gridcolor="#e2e8f0",
    )
    return fig


Marker = tuple[int, int]  # (step, invariant)


HOVER_LINE_CHARS = 90


def _wrapped(message: str) -> str:
    """A hover label's message in lines of at most HOVER_LINE_CHARS: plotly draws a label on one
    line as wide as its text, and a label wider than the plot (a message that names its cause)
    was not drawn at all beside the last marker."""
    return "<br>".join(textwrap.wrap(message, HOVER_LINE_CHARS, break_long_words=False)) or message


def _customdata(
    keys: list[Marker], counts: Counter, messages: dict[Marker, str], firsts: dict[Marker, int]
) -> np.ndarray:
    """Per marker: its count, its first message, its first violation's index (a click opens it).
    One object array: plotly takes it whole, where a list of lists is validated item by item
    (up to 10,000 markers: 0.04 s of an upload's first render); the JSON is the same."""
    data = np.empty((len(keys), 3), dtype=object)
    data[:, 0] = [counts[k] for k in keys]
    data[:, 1] = [messages[k] for k in keys]
    data[:, 2] = [firsts.get(k) for k in keys]
    return data


def _title(trace: Trace, report: Report) -> str:
    if not report.violations:
        steps = len(trace.steps)
        return f"Invariant timeline · <span style='color:{OK_COLOR}'>all invariants hold in {steps} steps</span>"
    shown = len(report.violations)
    more = f" ({shown} listed)" if report.violation_count > shown else ""
    return f"Invariant timeline · <span style='color:{FLAG_COLOR}'>{report.violation_count} violation(s){more}</span>"


def _mark_first(fig: go.Figure, report: Report) -> None:
    first = report.first_violation
    if first is None:
        return
    fig.add_vline(x=first.step, line={"color": FIRST_FLAG_COLOR, "width": 1.5, "dash": "dash"})
    fig.add_trace(
        go.Scatter(
            x=[first.step],
            y=[int(first.invariant)],
            mode="markers",
            marker={"symbol": "star", "size": 22, "color": FIRST_FLAG_COLOR, "line": {"color": "white", "width": 1}},
            customdata=[[1, first.message, 0]],  # index 0: a click opens the first violation
            hovertemplate=f"<b>first violation</b><br>step {first.step}, row {first.row}, seq {first.seq_id}"
            f"<br>{first.message}<extra></extra>",
        )
    )
    fig.add_annotation(
        x=first.step,
        y=int(first.invariant),
        text=f"<b>desync begins: step {first.step}, row {first.row}</b>",
        showarrow=True,
        arrowhead=2,
        ax=90,
        ay=-30,
        font={"color": "white", "size": 11},
        bgcolor=FIRST_FLAG_COLOR,
        arrowcolor=FIRST_FLAG_COLOR,
    )
