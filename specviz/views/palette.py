"""Colours and names shared by every view, so one kind of slot looks the same everywhere.

Red is reserved for "the fed state differs from the expected state": a new user should be able
to find where desynchronisation begins by looking for the first red cell, so no normal state
(a rejected draft, padding) is drawn in red.
"""

from __future__ import annotations

from specviz.analysis.slot_model import SLOT_KINDS

# Slot kinds as analysis names them, in legend order. Codes are the index in this tuple.
KINDS: tuple[str, ...] = SLOT_KINDS

KIND_COLORS: dict[str, str] = {
    "padding": "#f1f5f9",  # barely there: padding is not content
    "prompt": "#c7d2fe",
    "committed": "#93c5fd",
    "pending": "#a78bfa",
    "accepted": "#4ade80",
    "rejected": "#d6d3d1",  # grey, not red: rejection is normal speculative behaviour
    "bonus": "#facc15",
    "hole": "#fff7ed",  # a masked slot inside the row: pale, always outlined in red
    "extra": "#fb923c",  # attended slot beyond the committed tokens: always outlined in red
    "empty": "#ffffff",
}

KIND_LABELS: dict[str, str] = {
    "padding": "padding (masked)",
    "prompt": "prompt token (cached)",
    "committed": "generated earlier (cached)",
    "pending": "pending token (fed, no KV yet)",
    "accepted": "draft, accepted",
    "rejected": "draft, rejected",
    "bonus": "bonus token (target's own)",
    "hole": "masked hole inside the row",
    "extra": "extra attended slot (stale KV / absorbed pad)",
    "empty": "no token",
}

FLAG_COLOR = "#dc2626"
FIRST_FLAG_COLOR = "#7f1d1d"
OK_COLOR = "#16a34a"

# Verdict -> (background, text) colours; badges are HTML so they need no emoji font.
VERDICT_COLORS: dict[str, tuple[str, str]] = {
    "clean": ("#dcfce7", "#166534"),
    "exact": ("#dcfce7", "#166534"),
    "numerical": ("#fef9c3", "#854d0e"),
    "unexplained": ("#ffedd5", "#9a3412"),
    "desync": ("#fee2e2", "#991b1b"),
    "unreadable": ("#e0e7ff", "#3730a3"),  # the watch could not map the run from some step on
    "no-reference": ("#f1f5f9", "#334155"),
    "unread": ("#e0e7ff", "#3730a3"),  # a sequence of an unreadable run, agreeing as far as read
}


def verdict_badge(verdict: str) -> str:
    background, color = VERDICT_COLORS.get(verdict, ("#f1f5f9", "#334155"))
    return (
        f"<span class='sv-badge' style='background:{background};color:{color};padding:1px 8px;"
        f"border-radius:10px;font-weight:700'>{verdict.upper()}</span>"
    )


def kind_code(kind: str) -> int:
    return KINDS.index(kind)


def discrete_colorscale() -> list[list[object]]:
    """A stepped colorscale for z = kind code with zmin=-0.5, zmax=len(KINDS)-0.5."""
    count = len(KINDS)
    scale: list[list[object]] = []
    for i, kind in enumerate(KINDS):
        scale.append([i / count, KIND_COLORS[kind]])
        scale.append([(i + 1) / count, KIND_COLORS[kind]])
    return scale
