"""A trace as Chrome trace-event JSON, the format Perfetto's UI (ui.perfetto.dev) opens.

One process per batch (`batch_id`), one track (thread) per batch row, and on each row's track one
slice per phase of every verify step: `draft`, `verify`, `align`, with the durations the trace
recorded (`draft_ms`, `verify_ms`, `align_ms`). Steps are laid end to end on the time axis in the
order they were recorded (a step starts where the previous one's `total_ms` ended). A row's
`verify` slice carries its args: sequence, accepted drafts, position IDs fed and expected, KV
length fed and expected, and the violations the check found at that row and step; a violation is
also an instant event on the row's track, so Perfetto's search finds it by invariant name.

The JSON is written as it is produced, one event at a time: a big (Parquet) trace is never whole
in memory. It is strict JSON whatever the trace holds: a time that is not finite, negative or
absurd (over `MAX_PHASE_MS`) is clamped and the clamp said in the slice's args and in `otherData`
(a step of 1.5e308 ms made `"dur":Infinity`, which JSON.parse and Perfetto refuse); strings from the
trace are one line, capped (Perfetto shows them as text).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from specviz.analysis.report import Report, Violation
from specviz.trace.naming import run_title
from specviz.trace.schema import RowRecord, StepRecord, Trace
from specviz.views.safe_text import plain_text

PHASES = (("draft", "draft_ms"), ("verify", "verify_ms"), ("align", "align_ms"))
MAX_PHASE_MS = 86_400_000.0  # a day: a longer phase is a broken clock, not a measurement
US_PER_MS = 1000.0
STEP_TRACK = 0  # tid of each batch's step track; row r is tid r + 1


def _violations_by_cell(report: Report) -> dict[tuple[int, int], list[Violation]]:
    cells: dict[tuple[int, int], list[Violation]] = {}
    for v in report.violations:
        cells.setdefault((v.step_index, v.row), []).append(v)
    return cells


def clamped_ms(value: object) -> tuple[float, bool]:
    """(a drawable duration in ms, whether it was clamped): finite, 0..MAX_PHASE_MS."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        return 0.0, True
    return (MAX_PHASE_MS, True) if value > MAX_PHASE_MS else (float(value), False)


def step_times(step: StepRecord) -> tuple[dict[str, float], float, list[str]]:
    """The step's phase durations and its total (ms, clamped), and the fields clamped."""
    phases, clamped = {}, []
    for _, name in PHASES:
        phases[name], bad = clamped_ms(getattr(step, name))
        clamped += [name] if bad else []
    total, bad = clamped_ms(step.total_ms)
    clamped += ["total_ms"] if bad else []
    return phases, max(total, sum(phases.values())), clamped


def _row_args(row: RowRecord, expected_positions: list[int], found: list[Violation]) -> dict[str, Any]:
    return {
        "seq_id": row.seq_id,
        "committed_before": row.committed_before,
        "drafted": len(row.draft_tokens),
        "accepted": row.accepted,
        "emitted": len(row.emitted),
        "positions": row.position_ids,
        "positions_expected": expected_positions,
        "kv_len": row.kv_len,
        "kv_len_expected": row.kv_len_expected,
        "left_pad": row.left_pad,
        "violations": [plain_text(f"invariant {int(v.invariant)} {v.name}: {v.message}", 400) for v in found],
    }


def _step_events(index: int, step: StepRecord, start_us: float, cells: dict) -> Iterator[dict[str, Any]]:
    pid = step.batch_id
    flagged = sum(len(cells.get((index, row.row), [])) for row in step.rows)
    phases, total_ms, clamped = step_times(step)
    args: dict[str, Any] = {"clamped": [f"{name}={getattr(step, name)!r}"[:60] for name in clamped]} if clamped else {}
    yield {
        "name": f"step {step.step}",
        "cat": "step",
        "ph": "X",
        "ts": start_us,
        "dur": total_ms * US_PER_MS,
        "pid": pid,
        "tid": STEP_TRACK,
        "args": {"step": step.step, "index": index, "rows": len(step.rows), "cache_len": step.cache_len,
                 "query_len": step.query_len, "violations": flagged, **args},
    }  # fmt: skip
    for row in step.rows:
        n = row.committed_before
        expected = list(range(n - 1, n - 1 + len(row.position_ids)))
        found = cells.get((index, row.row), [])
        at = start_us
        for name, field in PHASES:
            dur = phases[field] * US_PER_MS
            event: dict[str, Any] = {
                "name": name, "cat": "phase", "ph": "X", "ts": at, "dur": dur, "pid": pid, "tid": row.row + 1,
            }  # fmt: skip
            if name == "verify":
                event["args"] = _row_args(row, expected, found)
                if found:
                    event["cname"] = "terrible"  # the legacy viewer's red: a violating row-step stands out
            yield event
            for v in found if name == "verify" else ():
                yield {
                    "name": f"violation {int(v.invariant)} {v.name}", "cat": "violation", "ph": "i", "s": "t",
                    "ts": at, "pid": pid, "tid": row.row + 1,
                    "args": {"message": plain_text(v.message, 400), "field": plain_text(v.field, 80)},
                }  # fmt: skip
            at += dur


def perfetto_events(trace: Trace, report: Report) -> Iterator[dict[str, Any]]:
    """Every trace event of the run, metadata first, then step by step in recorded order."""
    title = plain_text(run_title(trace.header.method, trace.header.fault))
    cells = _violations_by_cell(report)
    named: set[tuple[int, int]] = set()
    clock_us = 0.0
    for index, step in enumerate(trace.steps):
        pid = step.batch_id
        if (pid, STEP_TRACK) not in named:
            named.add((pid, STEP_TRACK))
            yield {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{title} · batch {pid}"}}
            yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": STEP_TRACK, "args": {"name": "steps"}}
            yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": STEP_TRACK, "args": {"sort_index": 0}}
        for row in step.rows:
            if (pid, row.row + 1) not in named:
                named.add((pid, row.row + 1))
                tid = row.row + 1
                yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": f"row {row.row}"}}
                yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        yield from _step_events(index, step, clock_us, cells)
        clock_us += step_times(step)[1] * US_PER_MS


def write_perfetto(trace: Trace, report: Report, out: IO[str]) -> int:
    """Write the JSON object to `out` one event at a time; returns the number of events."""
    clamped = sum(bool(step_times(step)[2]) for step in trace.steps)
    other = {"source": "specviz", "verdict": report.verdict, "violations": report.violation_count}
    out.write('{"displayTimeUnit": "ms", "otherData": ')
    json.dump({**other, "steps_with_clamped_times": clamped}, out, allow_nan=False)
    out.write(', "traceEvents": [\n')
    count = 0
    for event in perfetto_events(trace, report):
        # allow_nan=False: a value that slipped past the clamps fails here, never as a file no one opens.
        out.write(("," if count else "") + json.dumps(event, separators=(",", ":"), allow_nan=False) + "\n")
        count += 1
    out.write("]}\n")
    return count


def export_perfetto(trace: Trace, report: Report, path: str | Path) -> int:
    with open(path, "w", encoding="utf-8") as out:
        return write_perfetto(trace, report, out)
