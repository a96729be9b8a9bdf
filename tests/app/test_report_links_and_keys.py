"""Sharing and walking a run, without a browser: the slot pickers and labels, the A vs B prompts
note, the report, the Perfetto export, the link state, the keys, the cell details and the messages."""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specviz import cli
from specviz.analysis.check import check_trace
from specviz.app import loading, share
from specviz.errors import SpecvizError
from specviz.trace.io import load_trace, save_trace
from specviz.trace.schema import Trace
from specviz.views import analyse, slot_summary_markdown
from specviz.views.grid import NO_ROW
from specviz.views.perfetto import export_perfetto
from specviz.views.report import report_html
from specviz.views.summary import compare_table

CLEAN = "default-eqspec.json.gz"
FAULTY = "default-eqspec-column-positions.json.gz"
GEMMA = "gemma-eqspec.json.gz"


@pytest.fixture
def local_a() -> object:
    loaded = loading.open_local_a(loading.TRACES / FAULTY)
    yield loaded
    loading.LOCAL_A.clear()


def test_the_trace_run_is_slot_a_pick_and_examples_say_so(local_a: object) -> None:
    choices = loading.slot_choices("A")
    assert choices[0] == (f"{FAULTY} (your --trace file)", loading.LOCAL_CHOICE)
    assert loading.load_bundled(loading.LOCAL_CHOICE) is local_a  # picked back: the same run
    assert loading.slot_choices("B") == loading.bundled_traces()  # B never offers A's file
    assert "bundled example" not in slot_summary_markdown(local_a, "A")
    assert "Run B (bundled example)" in slot_summary_markdown(loading.load_bundled(CLEAN), "B")


def test_a_vs_b_says_when_the_runs_share_no_prompts() -> None:
    runs = {name: loading.load_bundled(name) for name in (CLEAN, FAULTY, GEMMA)}

    def prompts_row(a: str, b: str) -> list[str]:
        pairs = [(label, runs[n].trace, runs[n].report) for label, n in (("A", a), ("B", b))]
        return compare_table(pairs).set_index("metric").loc["prompts in common"].tolist()

    count = len(runs[CLEAN].trace.sequences)
    assert prompts_row(CLEAN, FAULTY) == [f"{count} of {count}"] * 2
    assert all(cell.startswith("none: different prompts") for cell in prompts_row(FAULTY, GEMMA))


# ----------------------------------------------------------------------------- the report and the export

HOSTILE = "<img src=https://evil.example/x.png onerror=alert(1)>"


class _Resources(HTMLParser):
    """Every tag and attribute of an HTML page: what a browser could fetch or run."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(name, value or "") for name, value in attrs]


def hostile_trace(name: str = FAULTY) -> Trace:
    """A bundled trace with markup in every string a report shows (a trace is untrusted)."""
    trace = load_trace(loading.TRACES / name)
    trace.header.fault = HOSTILE
    trace.header.target.name = f"/home/me/models/{HOSTILE}"
    trace.sequences[0].prompt = "see https://evil.example and </pre><script>alert(1)</script>"
    token = trace.steps[0].rows[0].pending_token
    trace.header.token_text = {**trace.header.token_text, str(token): HOSTILE}
    return trace


def test_report_is_self_contained_and_escapes_the_trace(tmp_path: Path) -> None:
    trace = hostile_trace()
    loaded = analyse(trace, "hostile.json.gz")
    page = report_html(loaded, "hostile.json.gz")
    parsed = _Resources()
    parsed.feed(page)
    # Nothing to fetch or run: no external element, no URL in any attribute, no CSS url().
    assert not {"img", "link", "iframe", "object", "embed", "script", "a"} & set(parsed.tags), parsed.tags
    assert not [value for _, value in parsed.attrs if "http" in value.lower() or "javascript:" in value.lower()]
    assert not [name for name, _ in parsed.attrs if name.startswith("on")]  # no event handler survived
    assert "url(" not in page and "@import" not in page
    assert HOSTILE not in page and html.escape(HOSTILE) in page  # shown, as text
    # The findings are there: first violation, the grid's cells, fed vs expected, the outputs, the JSON.
    first = loaded.report.first_violation
    assert f"Desync begins at step {first.step}, row {first.row}" in page
    assert page.count("<rect") >= len(trace.steps[first.step_index].rows)
    assert "fed vs expected" in page and "data-divergent='true'" in page
    embedded = json.loads(html.unescape(page.split("id='check-json'>", 1)[1].split("</pre>", 1)[0]))
    assert embedded["verdict"] == loaded.report.verdict == "desync"
    assert embedded["first_violation"] == first.to_dict()


def test_report_and_export_commands(tmp_path: Path) -> None:
    source = loading.TRACES / "default-eqspec-stale-kv.json.gz"
    out = tmp_path / "finding.html"
    assert cli.main(["report", str(source), "-o", str(out)]) == 0
    assert "Desync begins at step" in out.read_text()
    assert cli.main(["report", str(source), "-o", str(out)]) == 2  # exists: --force to replace it
    assert cli.main(["export", "--perfetto", str(source), "-o", str(tmp_path / "p.json")]) == 0
    assert cli.main(["export", "--perfetto", str(tmp_path / "missing.json"), "-o", str(tmp_path / "q.json")]) == 2


def test_perfetto_export_is_trace_event_json(tmp_path: Path) -> None:
    """The Chrome trace-event format's rules (what Perfetto's JSON importer reads), checked on the
    file; the values checked against the trace and the check, which computed them independently."""
    trace = load_trace(loading.TRACES / "default-eqspec-stale-kv.json.gz")
    report = check_trace(trace)
    path = tmp_path / "out.json"
    count = export_perfetto(trace, report, path)
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    assert len(events) == count and data["displayTimeUnit"] == "ms"
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:  # a complete event: a name, a start and a duration in µs, on a named track
        assert isinstance(e["name"], str) and e["ts"] >= 0 and e["dur"] >= 0, e
        assert (e["pid"], e["tid"]) in named, e
    rows = {(s.batch_id, r.row) for s in trace.steps for r in s.rows}
    assert {(pid, tid - 1) for pid, tid in named if tid > 0} == rows  # a track per batch row
    verify = [e for e in slices if e["name"] == "verify"]
    assert len(verify) == sum(len(s.rows) for s in trace.steps)
    step0 = trace.steps[0]
    first = next(e for e in verify if e["tid"] == step0.rows[0].row + 1)
    assert first["dur"] == pytest.approx(step0.verify_ms * 1000)
    assert first["args"]["accepted"] == step0.rows[0].accepted
    assert first["args"]["kv_len"] == step0.rows[0].kv_len
    assert first["args"]["positions"] == step0.rows[0].position_ids
    flagged = sum(len(e["args"]["violations"]) for e in verify)
    assert flagged == len(report.violations) == sum(e["ph"] == "i" for e in events)
    # Steps follow one another: each step's slices start where the previous step ended.
    starts = [e["ts"] for e in slices if e["cat"] == "step"]
    assert starts == sorted(starts) and len(starts) == len(trace.steps)


def test_app_takes_host_and_port_flags() -> None:
    import app

    assert app.server_address(app.parse_args(["--port", "8123", "--host", "0.0.0.0"])) == {
        "server_name": "0.0.0.0",
        "server_port": 8123,
    }
    assert app.server_address(app.parse_args([])) == {}  # Gradio's defaults and its environment decide


# ----------------------------------------------------------------------------- links, keys, details


def test_a_link_is_checked_and_never_opens_a_path(local_a: object) -> None:
    state = share.LinkState.from_params({"slot": "b", "trace": FAULTY, "step": "3", "row": "x", "tab": "kv"})
    assert (state.slot, state.trace, state.step, state.row, state.tab) == ("B", FAULTY, 3, None, "kv")
    junk = share.LinkState.from_params({"slot": "C", "step": "1e9x", "tab": "<script>", "trace": "a" * 400})
    assert (junk.slot, junk.step, junk.tab, junk.trace) == ("A", None, None, None)
    assert share.LinkState.from_params(None).empty
    assert share.load_linked(loading.LOCAL_CHOICE) is local_a  # "--trace": the file this app opened
    assert share.load_linked(FAULTY).example
    for path in ("/etc/passwd", "../traces/" + FAULTY, str(loading.TRACES / FAULTY), "runs:x.json"):
        with pytest.raises(SpecvizError):
            share.load_linked(path)


def test_a_link_without_the_trace_flag_names_no_file() -> None:
    assert not loading.LOCAL_A  # as in public mode, where --trace is refused
    with pytest.raises(SpecvizError, match="opened none"):
        share.load_linked(loading.LOCAL_CHOICE)


def test_keys_walk_steps_violations_and_rows() -> None:
    loaded = loading.load_bundled(FAULTY)
    last = loaded.step_count - 1
    assert share.key_target(loaded, ".", 0, 0) == (1, 0)
    assert share.key_target(loaded, ",", 0, 0) is None  # nowhere before the first step
    assert share.key_target(loaded, ".", last, 0) is None
    # n / N: every violation's place in the report's order, forward then back, from before the first.
    places = sorted({(v.step_index, v.row) for v in loaded.report.violations})
    here, seen = (0, -1), []
    while (target := share.key_target(loaded, "n", *here)) is not None:
        seen.append(target)
        here = target
    assert seen == places
    back = []
    while (target := share.key_target(loaded, "N", *here)) is not None:
        back.append(target)
        here = target
    assert back == places[-2::-1]
    rows = [r.row for r in loaded.step_slots(2).rows]
    assert share.key_target(loaded, "j", 2, NO_ROW) == (2, rows[0])
    assert share.key_target(loaded, "j", 2, rows[0]) == (2, rows[1])
    assert share.key_target(loaded, "k", 2, rows[0]) is None
    assert share.key_target(loaded, "x", 2, rows[0]) is None
    assert share.parse_pick("n:1733") == ("n", []) and share.parse_pick("cell:3:41:99") == ("cell", [3, 41])
    assert share.parse_pick("") == ("", []) and share.parse_pick("x" * 200) == ("", [])


def test_cell_details_say_fed_expected_and_the_invariant() -> None:
    loaded = loading.load_bundled(FAULTY)
    first = loaded.report.first_violation
    panel = share.cell_details(loaded, first.step_index, first.row, None)  # Enter: the row's first differing cell
    grid = loaded.step_slots(first.step_index)
    cell = next(c for c in grid.find_row(first.row).slots if c.flagged)
    assert f"data-col='{cell.col}'" in panel
    assert "position fed</th><td style='color:#dc2626'>" not in panel  # only "differs" lines are red
    assert f"<th>position fed</th><td>{cell.fed_position}</td>" in panel
    assert f"<th>position expected</th><td>{cell.expected_position}</td>" in panel
    assert f"invariant {int(first.invariant)} {first.name}" in panel and "logical index j" in panel
    assert share.cell_details(loaded, first.step_index, first.row, 10**6) == ""  # no such cell: nothing
    assert share.cell_details(None, 0, 0, 0) == ""


# ----------------------------------------------------------------------------- messages


def test_positions_of_the_physical_slot_name_the_missing_position_ids() -> None:
    """The column-positions fault feeds each query its column in the padded tensor, as a model does
    for itself when `position_ids` is not passed under left padding: the finding names that cause.
    A positions bug of another shape (uniform-advance) does not get the hint."""
    hint = "positions follow the physical slot, not the row's logical index: is `position_ids` passed?"
    column = loading.load_bundled(FAULTY).report.first_violation
    assert column.name == "position-contiguity" and column.message.endswith(hint)
    other = loading.load_bundled("default-eqspec-uniform-advance.json.gz").report
    assert other.violation_count and not any(hint in v.message for v in other.violations)


def test_human_output_names_a_local_model_by_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = load_trace(loading.TRACES / CLEAN)
    trace.header.target.name = "/home/someone/private/models/qwen-0.5b"
    path = tmp_path / "t.json.gz"
    save_trace(trace, path)
    assert cli.main(["check", str(path)]) == 0
    human = capsys.readouterr().out
    assert "target qwen-0.5b (" in human and "/home/someone" not in human
    assert cli.main(["runs", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "qwen-0.5b" in table and "/home/someone" not in table
    assert cli.main(["runs", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["target"] == "/home/someone/private/models/qwen-0.5b"


def test_opening_a_link_restores_the_view_and_refuses_paths() -> None:
    """The page's load handler, given a link's query: the slot, run, step, row and tab it names; a
    link naming a path opens the defaults and says so, naming no path."""
    import app

    demo = app.build_app()
    preload = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "preload")

    def opened(**query: str) -> dict[str, Any]:
        values = preload.fn(40, False, SimpleNamespace(query_params=query))
        return {getattr(k, "elem_id", None) or type(k).__name__: v for k, v in values.items()}

    stale = "default-eqspec-stale-kv.json.gz"
    view = opened(slot="B", trace=stale, step="3", row="2", tab="kv")
    assert view["sv-inspect"] == "B" and view["sv-bundled-b"]["value"] == stale
    assert view["sv-step"]["value"] == 3 and view["sv-row"]["value"] == 2
    assert view["Tabs"].selected == "kv"
    assert f"data-trace='{stale}' data-step='3' data-row='2'" in view["sv-grid-legend"]
    refused = opened(slot="A", trace="/etc/passwd", step="1")
    status = refused["sv-status-a"]
    assert status["visible"] and "not a trace this app can open" in status["value"]
    assert "/etc" not in status["value"]  # the server path a link named is never echoed
    assert refused["sv-step"]["value"] == 1  # the rest of the link still applies
    unnamed = opened(slot="B", step="2", row="1")  # an upload's link: the page says it shows an example
    assert unnamed["sv-inspect"] == "B" and "names no run" in unnamed["sv-status-b"]["value"]
    assert not opened()["sv-status-a"]["visible"]  # a plain visit says nothing


def test_the_report_button_writes_one_file_per_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A button pressed again (or by every visitor of a bundled run) reuses the file while it lasts:
    a public Space's disk does not grow with clicks."""
    from specviz.app import live

    written: list[str] = []
    monkeypatch.setattr(live.LIVE_FOLDER, "new_file", lambda name: written.append(name) or tmp_path / name)
    loaded = analyse(load_trace(loading.TRACES / FAULTY), "mine")
    monkeypatch.setattr(share, "LIVE_FOLDER", live.LIVE_FOLDER)
    first = share.write_report(loaded)
    assert share.write_report(loaded) == first and len(written) == 1
    Path(first).unlink()  # pruned by age: the next press writes it again
    assert share.write_report(loaded) == first and len(written) == 2
    assert "Desync begins at step" in Path(first).read_text()
    with pytest.raises(SpecvizError):
        share.write_report(None)
