"""`python app.py --trace REPLAY --probe REPORT`: a probe report opens in its section on every page,
beside the replay trace in slot A, with its acceptance per draft position and the replay command
shown as escaped text; refused in public mode, like `--trace`."""

from __future__ import annotations

import dataclasses

import gradio as gr
import pytest

from specviz.app import probe_tab
from specviz.errors import SpecvizError
from specviz.probe import positions
from specviz.probe import report as rp
from specviz.views import probe as views

EVIL = '<img src="http://example.invalid/x.png"> [x](javascript:alert(1))'


def _report() -> rp.ProbeReport:
    """The bundled example, with acceptance per draft position and a replay command that carry text
    a crafted report could hold."""
    report = probe_tab.load_bundled_report("probe-example.json")
    by_position = positions.rates(100, [80, 60, 30])
    acceptance = rp.Acceptance("prometheus", 0, 300, 170, 0.57, 0.5, 0.6, 2.7, None, by_position)
    side = dataclasses.replace(report.side_a, acceptance=acceptance)
    command = rp.ReplayCommand("vllm", f"specviz watch --out t.json -- {EVIL}", (3,), 8, EVIL)
    return dataclasses.replace(report, side_a=side, replay_command=command, version=rp.VERSION)


def test_the_summary_shows_positions_and_the_replay_command_as_text():
    summary = probe_tab.summary_html(_report())
    assert "acceptance per draft position, side A" in summary and "0.75 given 0" in summary
    assert "replay offline under the watch: specviz watch --out t.json" in summary
    assert "<img" not in summary and "&lt;img" in summary
    figure = views.positions_plot(_report()).to_dict()
    (line,) = figure["data"]
    assert list(line["x"]) == [0, 1, 2] and list(line["y"]) == pytest.approx([0.8, 0.75, 0.5])


def test_probe_flag_opens_the_report_on_every_page(tmp_path, monkeypatch):
    path = tmp_path / "probe.json"
    rp.save_report(_report(), path)
    monkeypatch.setattr(probe_tab, "LOCAL_PROBE", [])
    probe_tab.open_local_probe(path)
    with gr.Blocks():
        section = probe_tab.ProbeSection.build()
    assert "replay offline under the watch" in section.summary.value
    assert section.state.value == probe_tab.LOCAL_PROBE[0] and section.map.value is not None
    monkeypatch.setenv("SPACE_ID", "someone/space")
    with pytest.raises(SpecvizError, match="refused in public mode"):
        probe_tab.open_local_probe(path)
