"""What a first reader is told, without a browser: plain trace messages, the compact summary, the
grid's legend, the live-run methods, `record`'s verdict and its quiet end in a closed pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.app.loading import TRACES, load_bundled
from specviz.app.messages import plain_trace_message
from specviz.app.run_slots import METHODS_SHOWN
from specviz.trace.io import TraceError, parse_trace_bytes
from specviz.trace.schema import METHODS
from specviz.views import slot_summary_markdown
from specviz.views.grid import grid_figure, legend_items
from specviz.views.summary import model_name

ROOT = Path(__file__).resolve().parents[2]


def _message(raw: bytes, name: str) -> str:
    with pytest.raises(TraceError) as caught:
        parse_trace_bytes(raw, name)
    return plain_trace_message(str(caught.value))


def test_trace_errors_read_as_plain_sentences() -> None:
    assert _message(os.urandom(64) + b"\xff", "x.json.gz") == (
        "x.json.gz is not a gzip file: a .json.gz upload must be gzip-compressed JSON"
    )
    assert "not a text file" in _message(b"\xff\xfe\x00", "x.json")
    assert "not a specviz trace" in _message(b'{"a": 1}', "a.json")
    assert "None" not in _message(b'{"a": 1}', "a.json")
    assert _message(b"{x", "c.json").startswith("c.json is not valid JSON: expecting property name")
    assert "holds a JSON array" in _message(b"[1]", "b.json")
    assert plain_trace_message("something new") == "something new"  # unknown messages pass through


def test_summary_has_no_table_and_hides_server_paths() -> None:
    text = slot_summary_markdown(load_bundled("default-eqspec-stale-kv.json.gz"), "A")
    assert "|---|" not in text  # a five-column table is wider than a phone or a half-width panel
    assert "exact match" in text and "violations" in text and "Desync begins at step" in text
    assert model_name("/srv/app/specviz/assets/default-target") == "…/assets/default-target"
    assert model_name("google/gemma-3-270m") == "google/gemma-3-270m"


def test_clean_legend_lists_only_what_is_present() -> None:
    clean = load_bundled("default-eqspec.json.gz")
    names = [label for _, label in legend_items(clean.step_slots(0))]
    assert "fed ≠ expected" not in names and not any("desync" in n for n in names)
    faulty = load_bundled("default-eqspec-stale-kv.json.gz")
    grid = faulty.step_slots(faulty.start_step_index())
    names = [label for _, label in legend_items(grid, grid.first_violation[0])]
    assert "fed ≠ expected" in names and any("desync begins here" in n for n in names)
    assert any("highlighted row" in n for n in names)
    fig = grid_figure(grid)
    assert fig.layout.showlegend is False and fig.layout.xaxis.tickangle == 0
    meta = fig.layout.meta["sv_grid"]
    assert meta["narrow"]["margin.r"] < meta["wide"]["margin.r"]
    assert all(len(t.replace("<b>", "")) < 60 for t in meta["narrow"]["yaxis.ticktext"])


def test_live_run_offers_every_method() -> None:
    assert set(METHODS_SHOWN) == set(METHODS) and "inplace" in METHODS_SHOWN


def _summary(as_json: bool, capsys: pytest.CaptureFixture[str]) -> str:
    from specviz.recording import _print_summary
    from specviz.trace.io import load_trace

    _print_summary(load_trace(TRACES / "default-eqspec-stale-kv.json.gz"), Path("run.json.gz"), as_json)
    return capsys.readouterr().out


def test_record_summary_says_the_verdict_and_first_violation(capsys: pytest.CaptureFixture[str]) -> None:
    text = _summary(False, capsys)
    assert "verdict            DESYNC" in text and "first violation    step" in text
    info = json.loads(_summary(True, capsys))
    assert info["verdict"] == "desync" and info["first_violation"]["step"] >= 0


def test_record_summary_into_a_closed_pipe_is_quiet() -> None:
    code = (
        "from pathlib import Path; from specviz.recording import _print_summary;"
        "from specviz.trace.io import load_trace;"
        f"t = load_trace({str(TRACES / 'default-eqspec-stale-kv.json.gz')!r});"
        "[_print_summary(t, Path('x'), True) for _ in range(30)]"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        f'{sys.executable} -c "{code}" | head -c 600 > /dev/null', shell=True, env=env, capture_output=True, text=True
    )
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
