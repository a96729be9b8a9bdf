"""A trace plus what every view needs from it, computed once when the run is loaded."""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go

from specviz.analysis.check import check_trace
from specviz.analysis.report import Report
from specviz.trace.schema import Trace
from specviz.views.grid import FedHistory, fed_history
from specviz.views.tokens import token_texts


@dataclass
class LoadedRun:
    trace: Trace
    report: Report
    source: str  # bundled file name, upload name or "live run"
    history: FedHistory
    texts: dict[int, str]
    figures: dict[str, go.Figure] = field(default_factory=dict)  # whole-run figures, built on demand

    @property
    def step_count(self) -> int:
        return len(self.trace.steps)

    def start_step_index(self) -> int:
        """Where a user should look first: the first violation's step, else the first step."""
        first = self.report.first_violation
        return first.step_index if first is not None else 0


def analyse(trace: Trace, source: str) -> LoadedRun:
    """Check the trace and index it for the grid; the slow part of loading, done once."""
    return LoadedRun(
        trace=trace,
        report=check_trace(trace),
        source=source,
        history=fed_history(trace),
        texts=token_texts(trace),
    )
