"""Sequence x step heatmaps: accepted drafts, KV length error, position-ID drift.

A 480-prompt run at batch 16 has ~30,000 row-steps; a browser draws that fine only binned. So the
matrices are capped (rows = sequences, columns = global steps) and binned when larger: acceptance
is averaged within a bin, while error measures keep the value of largest magnitude, so one broken
row-step is never averaged away.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from specviz.trace.schema import RowRecord, Trace
from specviz.views.palette import FLAG_COLOR

MAX_SEQUENCES = 160
MAX_STEPS = 240
ROW_PX = 28  # per sequence (bin): room for its label, which is never skipped up to LABEL_EVERY_UP_TO
MIN_HEIGHT = 240
MAX_HEIGHT = 1400
CHROME_PX = 130  # title, axis title and margins
LABEL_EVERY_UP_TO = 48  # beyond this many sequence bins plotly picks which to label
DIVERGING = [[0.0, "#1d4ed8"], [0.5, "#f1f5f9"], [1.0, FLAG_COLOR]]


@dataclass
class Binned:
    z: np.ndarray  # [sequence bins, step bins], NaN where no row-step falls
    seq_labels: list[str]  # one per sequence bin
    step_starts: list[int]  # global step number at which each step bin starts
    seq_bin: int  # sequences per bin
    step_bin: int  # steps per bin

    @property
    def binned(self) -> bool:
        return self.seq_bin > 1 or self.step_bin > 1


def _samples(trace: Trace, value: Callable[[RowRecord], float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step index, sequence rank, value) for every row-step, ranks in seq_id order."""
    rank = {seq_id: i for i, seq_id in enumerate(sorted(s.seq_id for s in trace.sequences))}
    steps, seqs, values = [], [], []
    for si, step in enumerate(trace.steps):
        for row in step.rows:
            steps.append(si)
            seqs.append(rank[row.seq_id])
            values.append(value(row))
    return np.asarray(steps, dtype=int), np.asarray(seqs, dtype=int), np.asarray(values, dtype=float)


def bin_matrix(
    trace: Trace,
    value: Callable[[RowRecord], float],
    reduce: str = "mean",
    max_sequences: int = MAX_SEQUENCES,
    max_steps: int = MAX_STEPS,
) -> Binned:
    """Bin `value(row)` over (sequence, step); `reduce` is "mean" or "extreme" (largest |value|)."""
    seq_ids = sorted(s.seq_id for s in trace.sequences)
    n_seq, n_step = max(len(seq_ids), 1), max(len(trace.steps), 1)
    seq_bin = math.ceil(n_seq / max_sequences)
    step_bin = math.ceil(n_step / max_steps)
    shape = (math.ceil(n_seq / seq_bin), math.ceil(n_step / step_bin))
    steps, seqs, values = _samples(trace, value)
    rows, cols = seqs // seq_bin, steps // step_bin
    if reduce == "mean":
        z = _bin_mean(shape, rows, cols, values)
    elif reduce == "extreme":
        z = _bin_extreme(shape, rows, cols, values)
    else:
        raise ValueError(f"unknown reduce {reduce!r}")
    labels = [_seq_label(seq_ids[i * seq_bin : (i + 1) * seq_bin]) for i in range(shape[0])]
    starts = [trace.steps[i * step_bin].step if trace.steps else 0 for i in range(shape[1])]
    return Binned(z, labels, starts, seq_bin, step_bin)


def _bin_mean(shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> np.ndarray:
    sums = np.zeros(shape)
    counts = np.zeros(shape)
    np.add.at(sums, (rows, cols), values)
    np.add.at(counts, (rows, cols), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _bin_extreme(shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> np.ndarray:
    high = np.full(shape, -np.inf)
    low = np.full(shape, np.inf)
    np.maximum.at(high, (rows, cols), values)
    np.minimum.at(low, (rows, cols), values)
    z = np.where(np.abs(low) > np.abs(high), low, high)
    return np.where(np.isfinite(z), z, np.nan)


def _seq_label(seq_ids: list[int]) -> str:
    if not seq_ids:
        return ""
    return f"seq {seq_ids[0]}" if len(seq_ids) == 1 else f"seq {seq_ids[0]}–{seq_ids[-1]}"


def _heatmap(binned: Binned, title: str, value_name: str, **style: object) -> go.Figure:
    step_note = f"–{binned.step_bin - 1} more" if binned.step_bin > 1 else ""
    reduce_note = " (per bin)" if binned.binned else ""
    fig = go.Figure(
        go.Heatmap(
            z=binned.z,
            x=binned.step_starts,
            y=binned.seq_labels,
            hovertemplate=f"%{{y}} · step %{{x}}{step_note}<br>{value_name}{reduce_note}: %{{z:.3g}}<extra></extra>",
            hoverongaps=False,
            **style,
        )
    )
    if binned.binned:
        title += f"<br><sup>binned: {binned.seq_bin} sequence(s) × {binned.step_bin} step(s) per cell</sup>"
    rows = len(binned.seq_labels)
    fig.update_layout(
        title={"text": title, "x": 0, "font": {"size": 14}},
        height=heatmap_height(rows),
        margin={"l": 10, "r": 10, "t": 60, "b": 40},
        plot_bgcolor="white",
    )
    fig.update_xaxes(title_text="step", showgrid=False)
    fig.update_yaxes(autorange="reversed", showgrid=False, type="category")
    if rows <= LABEL_EVERY_UP_TO:  # plotly skips every other category label once rows get tight
        fig.update_yaxes(tickmode="array", tickvals=binned.seq_labels, ticktext=binned.seq_labels)
    return fig


def heatmap_height(rows: int) -> int:
    """Tall enough that each sequence gets ROW_PX, never squashed below MIN_HEIGHT."""
    return int(min(max(CHROME_PX + ROW_PX * rows, MIN_HEIGHT), MAX_HEIGHT))


def _colorbar(title: str) -> dict[str, object]:
    """A colorbar whose ticks cannot crowd: a few of them, whatever the figure's height."""
    return {"title": {"text": title, "side": "right"}, "nticks": 6, "thickness": 14, "len": 1.0, "lenmode": "fraction"}


def acceptance_heatmap(trace: Trace) -> go.Figure:
    """Accepted drafts per row-step (0..k); blank where the sequence is not in the batch."""
    k = trace.header.draft_k
    binned = bin_matrix(trace, lambda r: r.accepted, "mean")
    title = f"Accepted drafts per sequence and step (0..{k})"
    if k == 0:
        title = "Plain greedy run: no drafts to accept"
    return _heatmap(
        binned, title, "accepted", colorscale="Viridis", zmin=0, zmax=max(k, 1), colorbar=_colorbar("accepted")
    )


def kv_error(row: RowRecord) -> float:
    """Attended cache slots minus the committed tokens whose KV a correct engine holds (n - 1)."""
    return row.kv_len - (row.committed_before - 1)


def position_drift(row: RowRecord) -> float:
    """First fed query position minus the expected one (n - 1); NaN if no position was fed."""
    if not row.position_ids:
        return float("nan")
    return row.position_ids[0] - (row.committed_before - 1)


def _error_heatmap(trace: Trace, value: Callable[[RowRecord], float], title: str, name: str) -> go.Figure:
    binned = bin_matrix(trace, value, "extreme")
    finite = binned.z[np.isfinite(binned.z)]
    worst = float(np.max(np.abs(finite))) if finite.size else 0.0
    bad = int(np.count_nonzero(finite)) if finite.size else 0
    verdict = f"{bad} cell(s) off, worst {worst:+.0f}" if bad else "0 everywhere: as expected"
    color = FLAG_COLOR if bad else "#166534"
    limit = max(worst, 1.0)
    return _heatmap(
        binned,
        f"{title} · <span style='color:{color}'>{verdict}</span>",
        name,
        colorscale=DIVERGING,
        zmin=-limit,
        zmax=limit,
        zmid=0,
        colorbar=_colorbar("slots"),
    )


def kv_heatmap(trace: Trace) -> go.Figure:
    return _error_heatmap(trace, kv_error, "KV length: attended cache slots − expected (n − 1)", "actual − expected")


def drift_heatmap(trace: Trace) -> go.Figure:
    return _error_heatmap(trace, position_drift, "Position-ID drift: first fed position − expected (n − 1)", "drift")
