"""Forensics: pure functions of a trace, no models needed (docs/forensics.md).

`check_trace(trace) -> Report` checks every invariant (`specviz.trace.invariants.Invariant`) on
every row of every step and judges each sequence and the run. The checks are plain functions of
two types: `Findings` (what has been found; `Findings.at(si, step, row)` binds its `flag` to one
row as a `RowFlags`) and `History` (the token history rebuilt from the rows' writes, one
`SequenceHistory` per sequence).
"""

from specviz.analysis.check import check_trace, margin_threshold_for
from specviz.analysis.findings import Findings, RowFlags
from specviz.analysis.history import History, SequenceHistory
from specviz.analysis.report import Report, SequenceVerdict, Violation
from specviz.trace.invariants import Invariant

__all__ = [
    "Findings",
    "History",
    "Invariant",
    "Report",
    "RowFlags",
    "SequenceHistory",
    "SequenceVerdict",
    "Violation",
    "check_trace",
    "margin_threshold_for",
]
