"""A Parquet trace opened lazily in the app: the same verdict and the same grid as the trace read
whole, while a step move reads one row group; `app.py --trace` refuses in public mode."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from specviz.trace.columnar import ParquetTraceWriter
from specviz.trace.columnar_read import ParquetTrace
from specviz.trace.io import load_trace
from specviz.trace.schema import Trace
from specviz.trace.synthetic import synthetic_trace
from specviz.views import analyse, grid_view, slot_summary_markdown
from specviz.views.run import OVERVIEW_STEPS

TRACES = Path(__file__).resolve().parents[2] / "traces"


def write(trace: Trace, path: Path, rows: int) -> Path:
    writer = ParquetTraceWriter(path, row_group_rows=rows)
    for step in trace.steps:
        writer.add_step(step)
    return writer.close(trace.header, trace.sequences)


def shifted_kv(trace: Trace) -> Trace:
    """A synthetic run whose row 1 feeds its pending token one position off at step 3: the KV of
    that token is computed at the wrong place, which later steps' cache slots show."""
    bad = copy.deepcopy(trace)
    row = bad.steps[3].rows[1]
    row.position_ids = [p + 1 for p in row.position_ids]
    return bad


def same_grid(eager, lazy, step: int, row: int | None) -> None:
    a, b = grid_view(eager, step, row, 64), grid_view(lazy, step, row, 64)
    assert (a.step_index, a.row, a.row_choices) == (b.step_index, b.row, b.row_choices)
    assert (a.step_text, a.row_text, a.legend) == (b.step_text, b.row_text, b.legend)
    assert a.figure.to_plotly_json() == b.figure.to_plotly_json()


@pytest.mark.parametrize("name", ["default-eqspec-stale-kv.json.gz", "default-eqspec-draft-positions.json.gz"])
def test_lazy_run_has_the_eager_verdict_and_grid_on_a_bundled_fault(name: str, tmp_path: Path) -> None:
    trace = load_trace(TRACES / name)
    path = write(trace, tmp_path / "t.parquet", rows=9)
    eager = analyse(ParquetTrace(path).read(), "t")
    lazy = analyse(ParquetTrace(path).open(), "t")
    assert lazy.lazy and not eager.lazy
    assert lazy.report.first_violation is not None
    assert lazy.report.verdict == eager.report.verdict
    assert lazy.report.first_violation == eager.report.first_violation
    assert slot_summary_markdown(lazy, "A") == slot_summary_markdown(eager, "A")
    start = lazy.start_step_index()
    for step in {0, max(start - 1, 0), start, start + 1, lazy.step_count - 1}:
        same_grid(eager, lazy, step, None)
    first = lazy.report.first_violation
    same_grid(eager, lazy, start, first.row)


def test_lazy_grid_shows_kv_fed_at_a_wrong_position_steps_later(tmp_path: Path) -> None:
    trace = shifted_kv(synthetic_trace(12, 4, 3, 16))
    path = write(trace, tmp_path / "s.parquet", rows=6)
    eager = analyse(ParquetTrace(path).read(), "s")
    lazy = analyse(ParquetTrace(path).open(), "s")
    assert lazy.report.verdict == eager.report.verdict
    assert lazy.report.first_violation == eager.report.first_violation
    # Steps after 3: row 1's cache holds the token fed off by one, drawn from the columnar history.
    later = lazy.step_slots(6).row(1)
    assert any("its KV was computed at position" in r for s in later.slots for r in s.reasons)
    for step in range(lazy.step_count):
        same_grid(eager, lazy, step, 1)


def test_step_navigation_reads_one_row_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(synthetic_trace(16, 4, 3, 16), tmp_path / "n.parquet", rows=8)  # 2 steps a group
    lazy = analyse(ParquetTrace(path).open(), "n")
    source = lazy.trace.steps.source
    assert source.num_row_groups > 4
    grid_view(lazy, 0, None, 64)  # the first step drawn builds the history (one columnar walk)
    reads: list[int] = []
    real = source._read_table

    def counted(group: int):
        reads.append(group)
        return real(group)

    monkeypatch.setattr(source, "_read_table", counted)
    for step in range(1, lazy.step_count):
        reads.clear()
        view = grid_view(lazy, step, None, 64)
        assert view.step_index == step
        group = next(g for g in range(source.num_row_groups) if source.group_starts[g + 1] > step)
        assert reads in ([], [group])  # a step of the group last read costs no read at all
        assert len(reads) == (1 if source.group_starts[group] == step else 0)
    whole = ParquetTrace(path).read().steps
    assert [lazy.trace.steps[i] for i in reversed(range(len(whole)))] == whole[::-1]  # one step decoded = the same


def test_whole_run_views_of_a_lazy_run_name_the_steps_they_show(tmp_path: Path, monkeypatch) -> None:
    from specviz.app.detail import AcceptanceTab, KvTab

    monkeypatch.setattr("specviz.views.run.OVERVIEW_STEPS", 5)
    path = write(synthetic_trace(16, 4, 3, 16), tmp_path / "o.parquet", rows=8)
    lazy = analyse(ParquetTrace(path).open(), "o")
    part, note = lazy.overview()
    assert len(part.steps) == 5 and note == f"showing steps 0..4 of {lazy.step_count} (indices; the rest stays on disk)"
    tab = AcceptanceTab(text="text", figure="figure", heatmap="heatmap", sequences="sequences")
    shown = tab.show(lazy)
    assert note in shown["heatmap"].layout.title.text
    assert all(note in f.layout.title.text for f in KvTab(kv="kv", drift="drift").show(lazy).values())
    eager = analyse(ParquetTrace(path).read(), "o")
    assert eager.overview() == (eager.trace, "") and OVERVIEW_STEPS >= 5
    # The metrics cover every step: the check's walk gathered the same sums as a walk of the records.
    whole = tab.show(eager)
    assert shown["text"] == whole["text"] and "acceptance rate" in shown["text"]
    assert shown["figure"].to_plotly_json() == whole["figure"].to_plotly_json()
    assert shown["sequences"].equals(whole["sequences"]) and len(shown["sequences"]) == 16
    assert note not in whole["heatmap"].layout.title.text


def test_local_trace_opens_in_slot_a_and_is_refused_in_public_mode(tmp_path: Path, monkeypatch) -> None:
    import app
    from specviz.app import loading

    path = write(synthetic_trace(8, 4, 3, 8), tmp_path / "a.parquet", rows=8)
    monkeypatch.setattr(loading, "LOCAL_A", [])
    monkeypatch.setattr(sys, "argv", ["app.py"])
    monkeypatch.delenv("SPACE_ID", raising=False)
    app.open_trace_arg(str(path))
    assert loading.LOCAL_A[0].lazy and loading.LOCAL_A[0].source == "local a.parquet"
    json_run = loading.load_local(TRACES / "default-eqspec.json.gz")  # JSON: loaded whole, as before
    assert not json_run.lazy and isinstance(json_run.trace.steps, list)

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(SystemExit) as exc:
        app.open_trace_arg(str(bad))
    assert str(exc.value).startswith("app.py: ") and "\n" not in str(exc.value)

    loading.LOCAL_A.clear()
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    with pytest.raises(SystemExit) as exc:
        app.open_trace_arg(str(path))
    assert str(exc.value) == f"app.py: {loading.PUBLIC_LOCAL_REFUSED}"
    assert loading.LOCAL_A == []
    assert app.parse_args(["--public", "--trace", "x.parquet"]).trace == "x.parquet"


def test_the_page_opens_on_the_local_trace_in_slot_a(tmp_path: Path, monkeypatch) -> None:
    import app
    from specviz.app import loading

    path = write(shifted_kv(synthetic_trace(12, 4, 3, 16)), tmp_path / "p.parquet", rows=6)
    monkeypatch.setattr(loading, "LOCAL_A", [])
    monkeypatch.setattr("specviz.app.page_open.LOCAL_A", loading.LOCAL_A)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setattr(sys, "argv", ["app.py"])
    app.open_trace_arg(str(path))
    demo = app.build_app()
    preload = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "preload")
    values = preload.fn(64, False)
    states = [v for k, v in values.items() if getattr(k, "elem_id", None) is None and v is loading.LOCAL_A[0]]
    assert states, "slot A's state is the local run"
    grid = next(v for k, v in values.items() if getattr(k, "elem_id", None) == "sv-grid")
    lazy = loading.LOCAL_A[0]
    first = lazy.report.first_violation  # the page opens on it: its step, its row
    expected = grid_view(lazy, first.step_index, first.row, 64).figure
    assert first.step_index > 0 and grid.to_plotly_json() == expected.to_plotly_json()


def test_columnar_history_answers_every_lookup_as_fed_history(tmp_path: Path) -> None:
    from specviz.analysis.fed_columns import ColumnarFedHistory
    from specviz.analysis.slots import fed_history, fed_position_before

    trace = shifted_kv(synthetic_trace(10, 4, 3, 12))
    trace.steps[5].rows[0].position_ids = trace.steps[5].rows[0].position_ids[:1]  # kept: capped by the list
    path = write(trace, tmp_path / "h.parquet", rows=7)
    eager = fed_history(ParquetTrace(path).read())
    columnar = ColumnarFedHistory(ParquetTrace(path))
    asked = 0
    for si, step in enumerate(trace.steps):
        seqs = {row.seq_id for row in step.rows}
        lazy = columnar.before_step(seqs, si)
        for s, i in [key for key in eager if key[0] in seqs] + [(min(seqs), 10**6)]:
            assert fed_position_before(lazy, s, i, si) == fed_position_before(eager, s, i, si), (si, s, i)
            asked += 1
    assert asked > 500 and any(p != i for (s, i), entries in eager.items() for _, p in entries)


def test_local_trace_is_checked_with_the_collector_paused_then_resumed(tmp_path: Path, monkeypatch) -> None:
    import gc

    from specviz.app import loading

    path = write(synthetic_trace(8, 4, 3, 8), tmp_path / "g.parquet", rows=8)
    monkeypatch.delenv("SPACE_ID", raising=False)
    seen: list[bool] = []
    real = loading.analyse
    monkeypatch.setattr(loading, "analyse", lambda trace, source: seen.append(gc.isenabled()) or real(trace, source))
    assert gc.isenabled()
    loaded = loading.load_local(path)
    assert seen == [False] and gc.isenabled() and loaded.lazy
    gc.disable()  # a caller that paused it keeps its pause
    try:
        loading.load_local(path)
        assert not gc.isenabled()
    finally:
        gc.enable()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(loading.TraceError):
        loading.load_local(bad)
    assert gc.isenabled()  # resumed when the file is refused too
