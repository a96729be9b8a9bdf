"""A trace as Chrome trace-event JSON, the format Perfetto's UI (ui.perfetto.dev) opens.

One process per batch (`batch_id`), one track (thread) per batch row, and on each row's track one
slice per phase of every verify step: `draft`, `verify`, `align`, with the durations the trace
recorded (`draft_ms`, `verify_ms`, `align_ms`). Steps are laid end to end on the time axis in the
order they were recorded (a step starts where the previous one's `total_ms` ended). A row's
`verify` slice carries its args: sequence, accepted drafts, position IDs fed and expected, KV
length fed and expected, and the violations the check found at that row and step; a violation is
also an instant event on the row's track, so Perfetto's search finds it by invariant name.

The JSON is written as it is produced, one event at a time: a big (Parquet) trace is never whole
in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from specviz.analysis.report import Report, Violation
from specviz.trace.naming import run_title
from specviz.trace.schema import RowRecord, StepRecord, Trace

PHASES = (("draft", "draft_ms"), ("verify", "verify_ms"), ("align", "align_ms"))
US_PER_MS = 1000.0
STEP_TRACK = 0  # tid of each batch's step track; row r is tid r + 1


def _violations_by_cell(report: Report) -> dict[tuple[int, int], list[Violation]]:
    cells: dict[tuple[int, int], list[Violation]] = {}
    for v in report.violations:
        cells.setdefault((v.step_index, v.row), []).append(v)
    return cells


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
        "violations": [f"invariant {int(v.invariant)} {v.name}: {v.message}" for v in found],
    }


def _step_events(index: int, step: StepRecord, start_us: float, cells: dict) -> Iterator[dict[str, Any]]:
    pid = step.batch_id
    flagged = sum(len(cells.get((index, row.row), [])) for row in step.rows)
    total_us = max(step.total_ms, step.draft_ms + step.verify_ms + step.align_ms) * US_PER_MS
    yield {
        "name": f"step {step.step}",
        "cat": "step",
        "ph": "X",
        "ts": start_us,
        "dur": total_us,
        "pid": pid,
        "tid": STEP_TRACK,
        "args": {"step": step.step, "index": index, "rows": len(step.rows), "cache_len": step.cache_len,
                 "query_len": step.query_len, "violations": flagged},
    }  # fmt: skip
    for row in step.rows:
        n = row.committed_before
        expected = list(range(n - 1, n - 1 + len(row.position_ids)))
        found = cells.get((index, row.row), [])
        at = start_us
        for name, field in PHASES:
            dur = getattr(step, field) * US_PER_MS
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
                    "ts": at, "pid": pid, "tid": row.row + 1, "args": {"message": v.message, "field": v.field},
                }  # fmt: skip
            at += dur


def perfetto_events(trace: Trace, report: Report) -> Iterator[dict[str, Any]]:
    """Every trace event of the run, metadata first, then step by step in recorded order."""
    title = run_title(trace.header.method, trace.header.fault)
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
        clock_us += max(step.total_ms, step.draft_ms + step.verify_ms + step.align_ms) * US_PER_MS


def write_perfetto(trace: Trace, report: Report, out: IO[str]) -> int:
    """Write the JSON object to `out` one event at a time; returns the number of events."""
    out.write('{"displayTimeUnit": "ms", "otherData": ')
    json.dump({"source": "specviz", "verdict": report.verdict, "violations": report.violation_count}, out)
    out.write(', "traceEvents": [\n')
    count = 0
    for event in perfetto_events(trace, report):
        out.write(("," if count else "") + json.dumps(event, separators=(",", ":")) + "\n")
        count += 1
    out.write("]}\n")
    return count


def export_perfetto(trace: Trace, report: Report, path: str | Path) -> int:
    with open(path, "w", encoding="utf-8") as out:
        return write_perfetto(trace, report, out)
