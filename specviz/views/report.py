"""A finding as one self-contained HTML file: what `specviz report` writes and the app's report button offers.

The file opens from a bug ticket with no server and no network: its CSS is inline, the grid is an
inline SVG, no script runs, nothing is fetched (no link, image or font points outside the file).
It holds the verdict, the first violation, the grid at that step with the violating row's fed vs
expected, the divergent outputs beside the reference, and the `check --json` payload itself.
A trace is untrusted: every string from it is escaped.
"""

from __future__ import annotations

import datetime as _dt
import html
import json

from specviz.analysis.metrics import summary
from specviz.trace.naming import run_title
from specviz.views.details import INVARIANT_EXPLAINED, cell_facts, focus_col, row_invariants
from specviz.views.grid_svg import grid_svg
from specviz.views.outputs import RunOutputs, outputs_html
from specviz.views.palette import verdict_badge
from specviz.views.run import LoadedRun, page_note, row_page, rows_per_page
from specviz.views.safe_text import html_text
from specviz.views.summary import VERDICT_MEANING, model_name

REPORT_CSS = """
body { font-family: ui-sans-serif, system-ui, sans-serif; margin: 16px auto; max-width: 1100px; padding: 0 12px;
  color: #0f172a; }
h1 { font-size: 1.4em; margin: 0 0 6px; } h2 { font-size: 1.1em; margin: 22px 0 6px; }
.sv-meta { color: #475569; font-size: 13px; }
.sv-scroll { overflow-x: auto; border: 1px solid #e2e8f0; border-radius: 6px; padding: 6px; }
table.sv-facts { border-collapse: collapse; font-size: 13px; }
table.sv-facts th, table.sv-facts td { border: 1px solid #e2e8f0; padding: 3px 8px; text-align: left;
  vertical-align: top; }
.sv-bad { color: #b91c1c; font-weight: 600; }
pre.sv-json { white-space: pre-wrap; word-break: break-all; font-size: 11px; background: #f8fafc; padding: 8px;
  max-height: 480px; overflow: auto; }
"""
MAX_JSON_VIOLATIONS = 200  # the embedded payload keeps the first ones (the count says how many in all)
REPORT_WINDOW = 24  # cache slots drawn: the grid fits a laptop screen, the query included


def check_payload(loaded: LoadedRun) -> dict:
    """`specviz check --json`'s object for this run (the report, its metrics), violations capped."""
    payload = loaded.report.to_dict()
    payload["metrics"] = summary(loaded.trace, loaded.report.totals)
    payload["violations"] = payload["violations"][:MAX_JSON_VIOLATIONS]
    return payload


def _facts_table(rows: list[tuple[str, str]], bad: set[str] = frozenset()) -> str:
    cells = "".join(
        f"<tr><th>{html_text(name)}</th><td{' class=sv-bad' if name in bad else ''}>{html_text(value, 600)}</td></tr>"
        for name, value in rows
    )
    return f"<table class='sv-facts'>{cells}</table>"


def _fed_vs_expected(loaded: LoadedRun, step_index: int, row: int) -> str:
    """The violating row's fields, fed beside expected, and the cell where it first differs."""
    grid = loaded.step_slots(step_index, row)
    grid_row = grid.find_row(row)
    if grid_row is None:
        return "<p>The violating row is not in this step's record.</p>"
    rec, expected = grid_row.record, grid_row.expected
    lines = [
        ("left padding", rec.left_pad, expected.left_pad),
        ("attended cache slots (kv_len)", rec.kv_len, expected.kv_len),
        ("query positions", rec.position_ids, expected.position_ids),
        ("written to sequence", rec.write_seq, expected.write_seq),
    ]
    body = "".join(
        f"<tr><th>{name}</th><td{' class=sv-bad' if fed != want else ''}>{html_text(fed, 400)}</td>"
        f"<td>{html_text(want, 400)}</td></tr>"
        for name, fed, want in lines
    )
    table = f"<table class='sv-facts'><tr><th>field</th><th>fed</th><th>expected</th></tr>{body}</table>"
    cell = cell_facts(grid, row, focus_col(grid_row, grid), loaded.texts) or []
    invariants = row_invariants(grid, row)
    return (
        table
        + "<h3>The cell where it differs</h3>"
        + _facts_table(cell, {"differs"})
        + ("<h3>Invariants this row breaks here</h3>" + _facts_table(invariants) if invariants else "")
    )


def report_html(loaded: LoadedRun, source: str | None = None) -> str:
    """The whole report for a loaded run (`specviz.views.analyse`); `source` names its file."""
    trace, report = loaded.trace, loaded.report
    h = trace.header
    title = run_title(h.method, h.fault)
    first = report.first_violation
    draft = f", draft {model_name(h.draft.name)}" if h.draft else ""
    meta = (
        f"target {model_name(h.target.name)} ({h.target.dtype}, {h.target.device}){draft} · batch {h.batch_size} · "
        f"k={h.draft_k} · {len(trace.sequences)} prompts · {len(trace.steps)} steps"
    )
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        # Nothing may be fetched, even if a string slipped through: the browser refuses any load.
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>specviz finding: {html_text(title)}</title><style>{REPORT_CSS}</style></head><body>",
        f"<h1>specviz finding: {html_text(title)} {verdict_badge(report.verdict)}</h1>",
        f"<p><i>{html_text(VERDICT_MEANING.get(report.verdict, ''))}</i></p>",
        f"<p class='sv-meta'>{html_text(meta, 600)}"
        + (f" · file {html_text(source)}" if source else "")
        + f" · report written {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC</p>",
    ]
    if not h.complete and report.unreadable is not None:  # the watch stopped reading: not interrupted
        step = report.unreadable["step"]
        parts.append(f"<p class='sv-bad'>Unreadable from step {step}: the trace holds only the steps read.</p>")
    elif not h.complete:
        parts.append("<p class='sv-bad'>Incomplete run: it was interrupted; the trace holds only what finished.</p>")
    parts.append("<h2>First violation</h2>")
    if first is None:
        parts.append(f"<p>None: every invariant holds ({report.violation_count} violations).</p>")
    else:
        parts.append(
            f"<p class='sv-bad'>Desync begins at step {first.step}, row {first.row} (sequence {first.seq_id}): "
            f"invariant {int(first.invariant)} {html_text(first.name)}: {html_text(first.message, 600)}</p>"
            f"<p>Invariant {int(first.invariant)} says: "
            f"{html_text(INVARIANT_EXPLAINED.get(int(first.invariant), ''))}. "
            f"{report.violation_count} violation(s) in the run.</p>"
        )
    if trace.steps:
        step_index = first.step_index if first is not None and first.step_index >= 0 else 0
        # One page of rows, the first violation's: a report costs what it draws, not the batch.
        row = first.row if first is not None else None
        per_page = rows_per_page(trace.steps[step_index], REPORT_WINDOW)
        grid = loaded.step_slots(step_index, row, per_page)
        lo, hi = row_page(grid.step, row, per_page)
        parts.append(f"<h2>The ragged grid at step {grid.step.step}</h2>")
        note = page_note(grid.step, lo, hi)
        parts.append(f"<p class='sv-meta'>{html_text(note.split(':')[0])}.</p>" if note else "")
        parts.append(
            "<p class='sv-meta'>Rows are batch rows, columns the cache slots fed to the verify pass, its query slots "
            "and the bonus column; numbers are the positions fed. Red outline: fed differs from expected; dark red: "
            "the run's first violation. Hover a cell for its facts.</p>"
        )
        parts.append(f"<div class='sv-scroll'>{grid_svg(grid, loaded.texts, REPORT_WINDOW)}</div>")
        if first is not None and first.row >= 0:
            parts.append(f"<h2>Row {first.row}: fed vs expected</h2>")
            parts.append(_fed_vs_expected(loaded, step_index, first.row))
    parts.append("<h2>Outputs against the reference</h2>")
    parts.append(outputs_html(RunOutputs("", trace, report, loaded.texts), None, page=0, only_diverged=True))
    parts.append(
        "<h2>The check's JSON</h2><p class='sv-meta'>What <code>specviz check --json</code> prints (the first "
        f"{MAX_JSON_VIOLATIONS} violations listed); a program reads it as the text of <code>#check-json</code>.</p>"
    )
    parts.append(
        f"<details><summary>show</summary><pre class='sv-json' id='check-json'>{json_block(loaded)}</pre></details>"
    )
    parts.append("</body></html>")
    return "".join(parts)


def json_block(loaded: LoadedRun) -> str:
    """The check's payload as indented JSON, escaped for a <pre> (html_text would fold its lines)."""
    return html.escape(json.dumps(check_payload(loaded), indent=1, default=str), quote=True)
