"""The CLI's messages for a wrong file are as plain as the app's, and what it reports of a run is
what ran: a picture named as a picture, a trace name the app would refuse refused before the run,
and the effective batch (never more rows than prompts) in record's summary, `check` and `runs`."""

from __future__ import annotations

from pathlib import Path

import pytest
from drafting import MANY, decode

from specviz.analysis.check import check_trace
from specviz.analysis.metrics import summary
from specviz.analysis.runs import run_row
from specviz.analysis.text import render_report
from specviz.cli import main
from specviz.trace.io import save_trace

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(48)


@pytest.mark.parametrize("command", ["check", "report"])
def test_a_picture_is_named_as_one(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    picture = tmp_path / "screenshot.png"
    picture.write_bytes(PNG)
    assert main([command, str(picture)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "a PNG image, not a specviz trace" in err and ".json" in err, err
    assert "UTF-8" not in err


def test_record_refuses_a_trace_name_the_app_would_not_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.txt"
    assert main(["record", "--num-prompts", "1", "--out", str(out)]) == 2  # refused before any model loads
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and ".json, .json.gz or .parquet" in err and "x.txt" in err, err
    assert not out.exists()


def test_the_effective_batch_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = MANY[:3]
    trace = decode("eqspec", "draft-model", 100_000, prompts=prompts)
    assert trace.header.batch_size == 100_000  # what was asked stays in the header
    assert summary(trace)["batch_size"] == 3  # record's summary (and its --json)
    assert "batch 3," in render_report(trace, check_trace(trace))  # `check`
    path = save_trace(trace, tmp_path / "run.json.gz")
    assert run_row(path).batch_size == 3  # `specviz runs`
