"""Every string a trace file carries reaches the page as text, never as something that acts
(issue 43, attack 1: `header.options.watch_unreadable.why` holding a Markdown image made the
visitor's browser fetch it as soon as the upload loaded). The test walks every string of the
schema (header and its options, model and fault names, notes, token text, prompts, outputs,
finish reasons), puts Markdown images and links, raw HTML and `javascript:` into one at a time,
and renders what the app shows of the run: the summary, the tables, the grid and its texts, the
details panel, the report and the Perfetto export. Markdown is rendered as a browser's Markdown
would (markdown-it, HTML allowed), then every output is read as HTML: no element that loads or
runs anything, no attribute naming the attacker's address or `javascript:`, no event handler."""

from __future__ import annotations

import copy
import io
import json
from html.parser import HTMLParser
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from specviz.app.share import cell_details
from specviz.trace.io import trace_from_dict, trace_to_dict
from specviz.trace.synthetic import synthetic_trace
from specviz.trace.validate import TraceError
from specviz.views import (
    acceptance_markdown,
    analyse,
    grid_view,
    sequence_table,
    slot_outputs_html,
    slot_summary_markdown,
    slots_compare_table,
    summary_markdown,
    violations_table,
)
from specviz.views.perfetto import write_perfetto
from specviz.views.report import report_html

HOST = "93.184.215.14"
PIECES = (
    f"![x](http://{HOST}/pixel.png)",
    "[click](javascript:alert(1))",
    f"<img src=http://{HOST}/i.png onerror=alert(1)>",
    f"<a href='http://{HOST}/'>a</a>",
    "<script>alert(1)</script>",
    "javascript:alert(1)",
    f"[ref]: http://{HOST}/r.png\n![r][ref]",
    f"<http://{HOST}/auto>",
    "`code` *em* __strong__ | cell | ~~s~~ \\",
    f'"><svg onload=alert(1)><image href="http://{HOST}/s.png"/>',
)
HOSTILE = " ".join(PIECES)
# Elements that load or run something; none of the app's own outputs use them.
ACTIVE_TAGS = {"img", "script", "iframe", "object", "embed", "base", "form", "image", "video", "audio", "source"}
ACTIVE_TAGS |= {"link", "frame", "applet"}
OWN_LINKS = ("/specviz/docs/", "#")
MARKDOWN = MarkdownIt("commonmark", {"html": True})


class ActiveFinder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ACTIVE_TAGS:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            value = (value or "").strip().lower()
            if name.startswith("on") or HOST in value or value.startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value[:40]}>")
            if tag == "a" and name == "href" and not value.startswith(OWN_LINKS):
                self.found.append(f"<a href={value[:40]}>")

    handle_startendtag = handle_starttag


def active(html_text: str) -> list[str]:
    finder = ActiveFinder()
    finder.feed(html_text)
    finder.close()
    return finder.found


def figure_strings(fig: go.Figure) -> list[str]:
    """Every string of a plotly figure (hover, text, labels, title): plotly renders a subset of HTML."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(json.loads(fig.to_json()))
    return found


def base_dict() -> dict[str, Any]:
    """A small run with violations (a stale KV length on one row), a piece table and every
    optional string present, as the JSON a file holds."""
    trace = synthetic_trace(4, 2, 3, 8)
    trace.steps[1].rows[0].kv_len += 1
    trace.header.fault = "stale-kv"
    used = {t for seq in trace.sequences for t in (*seq.prompt_ids, *seq.output_ids, *(seq.reference_ids or ()))}
    used |= {t for step in trace.steps for r in step.rows for t in (r.pending_token, *r.draft_tokens, *r.target_tokens)}
    trace.header.token_text = {str(t): f"t{t}" for t in sorted(used)}
    trace.header.library_versions = {"torch": "2.13", "transformers": "5.19"}
    trace.header.fault_events = [{"step": 1, "row": 0, "seq_id": 0, "what": "kv"}]
    trace.header.options = {"exspec_window": 4, "note": "n", "watch_unreadable": {"step": 2, "why": "w"}}
    data = trace_to_dict(trace)
    data["steps"][0]["rows"][0]["finish_reason"] = "eos"
    return data


def string_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths to every string value in `node` (dict keys of free-form maps too, as ("key", path))."""
    paths: list[tuple] = []
    if isinstance(node, str):
        return [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            paths += string_paths(value, (*prefix, key))
            if prefix and prefix[-1] in ("options", "library_versions"):
                paths.append(("key", *prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:3]):  # the first items stand for the rest: same code reads them
            paths += string_paths(value, (*prefix, i))
    return paths


BASE = base_dict()
SHOWN_IDS = {str(t) for t in BASE["sequences"][0]["output_ids"][:3]}  # a few entries stand for the table
PATHS = sorted({p for p in string_paths(BASE) if "token_text" not in p or p[-1] in SHOWN_IDS}, key=str)


def with_value(path: tuple, value: str) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    if path[0] == "key":  # a free-form map's key
        *parent, key = path[1:]
        node = data
        for part in parent:
            node = node[part]
        node[value] = node.pop(key)
        return data
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


def rendered(data: dict[str, Any]) -> dict[str, list[str]]:
    """What the app shows of the run: {"markdown": [...], "html": [...], "text": [...]}."""
    loaded = analyse(trace_from_dict(data), "upload x.json")
    trace, report = loaded.trace, loaded.report
    first = report.first_violation
    step = first.step_index if first else 0
    row = first.row if first else 0
    view = grid_view(loaded, step, row, 40)
    markdown = [
        slot_summary_markdown(loaded, "A"),
        summary_markdown(trace, report, "A"),
        acceptance_markdown(trace, report.totals),
        view.step_text,
        view.row_text,
    ]
    html = [view.legend, cell_details(loaded, step, row, None), report_html(loaded, "x<img src=x>.json")]
    html += [slot_outputs_html(loaded, loaded, "A", 1, False)]
    html += figure_strings(view.figure) + (figure_strings(view.tree) if view.tree else [])
    text = []
    tables = (slots_compare_table(loaded, None), violations_table(report), sequence_table(trace, report, report.totals))
    for table in tables:
        assert isinstance(table, pd.DataFrame)
        text += [str(cell) for cell in table.to_numpy().ravel()]
    out = io.StringIO()
    write_perfetto(trace, report, out)
    text.append(out.getvalue())
    return {"markdown": markdown, "html": html, "text": text}


def assert_inert(data: dict[str, Any]) -> None:
    try:
        shown = rendered(data)
    except TraceError:
        return  # refused in one line by the loader: nothing shown
    for md in shown["markdown"]:
        assert not active(MARKDOWN.render(md)), (active(MARKDOWN.render(md)), md[:300])
    for html_part in shown["html"]:
        assert not active(html_part), (active(html_part), html_part[:300])
    perfetto = json.loads(shown["text"][-1], parse_constant=lambda name: pytest.fail(name))
    assert perfetto["traceEvents"]
    for cell in shown["text"][:-1]:  # table cells are shown as text (Gradio's "str" datatype): one line
        assert "\n" not in cell


def test_the_base_run_shows_what_the_test_looks_for() -> None:
    shown = rendered(BASE)
    assert any("Desync begins" in md for md in shown["markdown"])
    assert any("Unreadable from step" in md for md in shown["markdown"])
    assert len(PATHS) > 30


@pytest.mark.parametrize("path", PATHS, ids=lambda p: ".".join(map(str, p))[-60:])
def test_every_string_field_reaches_the_page_inert(path: tuple) -> None:
    assert_inert(with_value(path, HOSTILE))


@given(st.sampled_from(PATHS), st.lists(st.sampled_from(PIECES), min_size=1, max_size=4), st.text(max_size=20))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_mix_of_markup_in_any_string_field_stays_inert(path: tuple, pieces: list[str], noise: str) -> None:
    assert_inert(with_value(path, noise.join(pieces)))
