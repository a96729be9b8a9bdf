"""The Perfetto export is strict JSON whatever times a trace records (issue 43, attack 7: step
times of 1.5e308 ms wrote `"dur":Infinity`, which JSON.parse and Perfetto's UI refuse): a time
that is not finite, negative or over a day is clamped, and the clamp is said in the step's args."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

from specviz.analysis.check import check_trace
from specviz.trace.io import load_trace, trace_to_json
from specviz.trace.synthetic import synthetic_trace
from specviz.views.perfetto import MAX_PHASE_MS, write_perfetto


def strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def exported(trace) -> dict:
    out = io.StringIO()
    write_perfetto(trace, check_trace(trace), out)
    return strict(out.getvalue())


@pytest.mark.parametrize("value", [1.5e308, math.inf, -math.inf, math.nan, -5.0, 1e12])
def test_absurd_step_times_are_clamped_and_said(value: float) -> None:
    trace = synthetic_trace(4, 2, 3, 8)
    for step in trace.steps:
        step.draft_ms = step.verify_ms = step.align_ms = step.total_ms = value
    data = exported(trace)
    slices = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    assert slices and all(math.isfinite(e["dur"]) and math.isfinite(e["ts"]) for e in slices)
    assert all(0 <= e["dur"] <= 4 * MAX_PHASE_MS * 1000 for e in slices)
    steps = [e for e in slices if e["cat"] == "step"]
    assert all(e["args"]["clamped"] for e in steps)  # the clamp is said where it happened
    assert data["otherData"]["steps_with_clamped_times"] == len(trace.steps)


def test_a_file_with_huge_times_exports_strict_json(tmp_path: Path) -> None:
    """Through the loader: 1.5e308 is a valid JSON number, and the sum of two of them is not finite."""
    trace = synthetic_trace(4, 2, 3, 8)
    text = re.sub(r'"(total_ms|draft_ms)":[0-9.e+-]+', r'"\1":1.5e308', trace_to_json(trace))
    path = tmp_path / "huge.json"
    path.write_text(text)
    loaded = load_trace(path)
    assert loaded.steps[0].total_ms == 1.5e308
    data = exported(loaded)
    assert all(math.isfinite(e.get("ts", 0)) for e in data["traceEvents"])


def test_trace_text_reaches_perfetto_as_one_capped_line() -> None:
    trace = synthetic_trace(4, 2, 3, 8)
    trace.header.method = "eqspec\n<img src=x onerror=alert(1)>" + "x" * 5000
    data = exported(trace)
    name = next(e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name")
    assert "\n" not in name and len(name) < 300
