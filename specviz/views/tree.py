"""The candidate tree of one verify step, per row: nodes by depth, the accepted path marked, the
first broken node in dark red. Drawn beside the ragged grid for traces of tree verification
(schema 3 `tree_parents`); what is broken is decided in `analysis.tree_checks`, this only draws."""

from __future__ import annotations

import plotly.graph_objects as go

from specviz.analysis.tree_checks import first_broken_node, tree_shape_error
from specviz.trace.schema import RowRecord, StepRecord
from specviz.views.safe_text import md_text

MAX_ROWS = 12  # rows drawn at once: a batch of 32 would make each tree unreadably small
MAX_NODES = 64  # a larger tree (only a crafted or foreign file) is not drawn: its row is left out
ROW_HEIGHT = 40  # pixels per lane of a drawn row
PATH = "#16a34a"  # accepted path (and root)
OTHER = "#cbd5e1"  # a candidate the target did not take
BROKEN = "#7f1d1d"  # the first broken node (dark red)
EDGE = "#94a3b8"


def is_tree_step(step: StepRecord) -> bool:
    return any(row.tree_parents is not None for row in step.rows)


def shown_rows(step: StepRecord, selected_row: int | None = None) -> list[RowRecord]:
    """At most MAX_ROWS rows with a tree: from the selected row on when one is picked."""
    rows = [
        r
        for r in step.rows
        if r.tree_parents is not None and len(r.tree_parents) <= MAX_NODES and tree_shape_error(r) is None
    ]
    if selected_row is not None:
        at = next((i for i, r in enumerate(rows) if r.row == selected_row), 0)
        rows = rows[at:] + rows[:at]
    return rows[:MAX_ROWS]


def _layout(parents: list[int]) -> list[float]:
    """Vertical offset of each node: leaves one lane each in depth-first order, a parent on its
    first child's lane (the main chain stays on one line, alternatives hang below it)."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    lane: dict[int, float] = {}
    next_lane = 0
    stack = [0]
    order = []  # depth first, children in order
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    for node in order:  # leaves take lanes in depth-first order
        if node not in children:
            lane[node] = next_lane
            next_lane += 1
    for node in reversed(order):  # a parent sits on its first child's lane (children come after it)
        if node in children:
            lane[node] = lane[children[node][0]]
    return [lane[node] for node in range(len(parents))]


def _label(token: int, texts: dict[int, str]) -> str:
    """The token's text, short; a whitespace token as a visible mark; no text: its ID."""
    text = texts.get(token)
    if text is None:
        return f"#{token}"
    if not text.strip():
        return "⏎" if "\n" in text else "␣"
    return md_text(text.strip()[:6])


def tree_figure(step: StepRecord, texts: dict[int, str], selected_row: int | None = None) -> go.Figure:
    """Per row (at most MAX_ROWS) its candidate tree: x = depth, one band per row."""
    rows = shown_rows(step, selected_row)
    fig = go.Figure()
    band = 0.0
    ticks, tick_text = [], []
    deepest = 1
    for row in rows:
        parents = row.tree_parents
        lanes = _layout(parents)
        depths = row.tree_depths or []
        depth = [0] * len(parents)
        for node, parent in enumerate(parents):
            depth[node] = 0 if parent < 0 else depth[parent] + 1
        deepest = max(deepest, *depth)
        path = {0, *(row.tree_path or [])}
        broken = first_broken_node(row)
        tokens = [row.pending_token, *row.draft_tokens]
        y = [-(band + lane) for lane in lanes]
        for node, parent in enumerate(parents):
            if parent < 0:
                continue
            on_path = node in path and parent in path
            fig.add_trace(
                go.Scatter(
                    x=[depth[parent], depth[node]],
                    y=[y[parent], y[node]],
                    mode="lines",
                    line={"color": PATH if on_path else EDGE, "width": 3 if on_path else 1},
                    hoverinfo="skip",
                    showlegend=False,
                )
            )
        colors = [BROKEN if node == broken else PATH if node in path else OTHER for node in range(len(parents))]
        hover = [
            f"row {row.row} · seq {row.seq_id} · node {node} (depth {depth[node]}"
            + (f", recorded {depths[node]}" if node < len(depths) and depths[node] != depth[node] else "")
            + f")<br>token {_label(tokens[node], texts)} · position {row.position_ids[node]}"
            + f"<br>target's choice after it: {_label(row.target_tokens[node], texts)}"
            + ("<br><b>first broken node</b>" if node == broken else "")
            + ("<br>accepted" if node in path and node else "")
            for node in range(len(parents))
        ]
        fig.add_trace(
            go.Scatter(
                x=depth,
                y=y,
                mode="markers+text",
                marker={"size": 20, "color": colors, "line": {"color": "#0f172a", "width": 1}},
                text=[_label(t, texts) for t in tokens],
                textposition="top center",
                textfont={"size": 10},
                hovertext=hover,
                hoverinfo="text",
                showlegend=False,
            )
        )
        ticks.append(-band)
        tick_text.append(f"row {row.row}")
        band += max(lanes) + 1.6
    fig.update_layout(
        height=max(160, int(ROW_HEIGHT * band) + 60),
        margin={"l": 10, "r": 10, "t": 24, "b": 50},
        plot_bgcolor="white",
        autosize=True,
        xaxis={
            "title": {"text": "depth · green: accepted path · dark red: first broken node", "font": {"size": 11}},
            "dtick": 1,
            "range": [-0.4, deepest + 0.4],
            "zeroline": False,
        },
        yaxis={"tickvals": ticks, "ticktext": tick_text, "zeroline": False, "showgrid": False},
    )
    if len(rows) < sum(r.tree_parents is not None for r in step.rows):
        fig.add_annotation(
            text=f"{len(rows)} of {len(step.rows)} rows shown (pick a row to start there)",
            showarrow=False, x=1, y=1.02, xref="paper", yref="paper", xanchor="right", font={"size": 10},
        )  # fmt: skip
    return fig
