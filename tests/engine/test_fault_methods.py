"""Where each fault fires, said in one place: `Fault.default_method` is the method docs/faults.md
names for the fault and the one `record --fault F` runs without --method, and a run where the
fault's decision was never reached says so ("never fired"), naming where it fires."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from drafting import MANY, decode

from specviz.analysis.check import check_trace
from specviz.analysis.notes import fault_never_fired_note, run_notes
from specviz.analysis.text import render_report
from specviz.cli import build_parser
from specviz.engine.faults import FAULTS
from specviz.recording import record_method
from specviz.trace.schema import FAULT_FIRES_ON
from specviz.views.summary import summary_markdown

METHODS = ("eqspec", "exspec")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "faults.md"


def documented() -> dict[str, tuple[str, int]]:
    """Each fault's (default method, rows it needs) as docs/faults.md's tables say: the cell after
    the fault's name is the method ("eqspec"), or says "default `exspec`" among the settings it
    needs; the sixth ("only in ragged batches?", "only with two rows?") starts "yes" for 2 rows."""
    found = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`([a-z0-9-]+)`", cells[0]) if len(cells) > 5 else None
        if name is None:
            continue
        said = re.search(r"default `?([a-z]+)`?", cells[1])
        found[name.group(1)] = (said.group(1) if said else cells[1], 2 if cells[5].startswith("yes") else 1)
    return found


def test_docs_say_where_each_fault_fires() -> None:
    docs = documented()
    assert set(docs) == set(FAULTS)  # every fault has its row, and no row names a fault gone
    assert {name: (cls.default_method, cls.needs_rows) for name, cls in FAULTS.items()} == docs


def recorded_method(*argv: str) -> str:
    return record_method(build_parser().parse_args(["record", *argv]))


def test_record_without_method_runs_the_faults_own() -> None:
    assert recorded_method("--fault", "request-order") == "exspec"
    assert recorded_method("--fault", "stale-kv") == "eqspec"
    assert recorded_method("--fault", "request-order", "--method", "eqspec") == "eqspec"  # asked: kept
    assert recorded_method() == "eqspec"


@pytest.fixture(scope="module")
def request_order_runs() -> dict[str, object]:
    """request-order on eqspec (rows stay in request order: it never fires) and on its own method."""
    prompts = MANY[:6]
    return {
        method: decode(method, "draft-model", 4, prompts=prompts, fault="request-order")
        for method in ("eqspec", "exspec")
    }


def test_a_fault_that_never_fires_is_said_with_where_it_fires(request_order_runs: dict) -> None:
    quiet = request_order_runs["eqspec"]
    assert quiet.header.fault_events == []  # the engine's own log: the decision was never reached
    report = check_trace(quiet)
    assert report.verdict == "clean"  # the checker agrees: nothing went wrong, so nothing was tested
    said = "fault request-order never fired in this run: it fires on exspec, in a batch of two rows or more"
    assert fault_never_fired_note(quiet.header).startswith(said)
    assert said in render_report(quiet, report)  # `specviz check`
    assert "Fault request-order never fired in this run" in summary_markdown(quiet, report)  # the app
    fired = request_order_runs["exspec"]
    assert fired.header.fault_events and fault_never_fired_note(fired.header) is None
    assert check_trace(fired).verdict == "desync"


def test_a_trace_that_does_not_say_where_its_fault_fires_gets_no_guess(request_order_runs: dict) -> None:
    quiet = request_order_runs["eqspec"]
    options = dict(quiet.header.options)
    try:
        del quiet.header.options[FAULT_FIRES_ON]  # as an older specviz or another engine writes it
        assert run_notes(quiet, check_trace(quiet)) == []
    finally:
        quiet.header.options.clear()
        quiet.header.options.update(options)
