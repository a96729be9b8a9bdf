"""The Parquet container holds exactly what the JSON container holds: every bundled trace and a
synthetic run round-trip through it unchanged, steps stream a row group at a time, an interrupted
writer leaves a readable file, a crafted file is refused in one line, and local files have no size
cap while uploads keep theirs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specviz.cli import main
from specviz.trace import io as trace_io
from specviz.trace.columnar import (
    METADATA_KEY,
    SEQUENCES_KEY,
    TABLE_SCHEMA,
    ColumnarError,
    ParquetTraceWriter,
    is_parquet,
)
from specviz.trace.columnar_read import ParquetTrace
from specviz.trace.io import TraceError, load_trace, parse_trace_bytes, save_trace, trace_to_json
from specviz.trace.synthetic import synthetic_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.json.gz")))
def test_bundled_traces_round_trip_through_parquet(name: str, tmp_path: Path) -> None:
    trace = load_trace(TRACES / name)
    out = save_trace(trace, tmp_path / "t.parquet")
    assert is_parquet(out)
    assert trace_to_json(load_trace(out)) == trace_to_json(trace)


def test_steps_stream_by_row_group_in_order(tmp_path: Path) -> None:
    trace = synthetic_trace(40, 8, 4, 24)
    writer = ParquetTraceWriter(tmp_path / "s.parquet", row_group_rows=50)
    for step in trace.steps:
        writer.add_step(step)
    writer.close(trace.header, trace.sequences)
    opened = ParquetTrace(tmp_path / "s.parquet")
    assert opened.num_row_groups > 3  # small row groups: several of them
    # A row group holds whole steps: its step range never overlaps the next one's.
    ranges = [opened.step_range(g) for g in range(opened.num_row_groups)]
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    streamed = list(opened.iter_steps())
    assert [s.step for s in streamed] == [s.step for s in trace.steps]
    assert sum(len(s.rows) for s in streamed) == sum(len(s.rows) for s in trace.steps)


def test_interrupted_writer_keeps_finished_row_groups(tmp_path: Path) -> None:
    trace = synthetic_trace(24, 8, 4, 24)
    path = tmp_path / "partial.parquet"
    writer = ParquetTraceWriter(path, row_group_rows=20)
    half = len(trace.steps) // 2
    for step in trace.steps[:half]:
        writer.add_step(step)
    trace.header.complete = False  # what the engine says of a run stopped by Ctrl-C
    writer.close(trace.header, trace.sequences)
    loaded = load_trace(path)
    assert not loaded.header.complete
    assert [s.step for s in loaded.steps] == [s.step for s in trace.steps[:half]]


def test_aborted_writer_leaves_nothing(tmp_path: Path) -> None:
    writer = ParquetTraceWriter(tmp_path / "x.parquet")
    writer.add_step(synthetic_trace(2, 2, 2, 4).steps[0])
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_parquet_is_smaller_than_gzip_json(tmp_path: Path) -> None:
    trace = synthetic_trace(256, 64, 4, 64)
    json_size = save_trace(trace, tmp_path / "t.json.gz").stat().st_size
    parquet_size = save_trace(trace, tmp_path / "t.parquet").stat().st_size
    assert parquet_size < json_size


def _rewrite(path: Path, out: Path, table=None, metadata=None) -> Path:
    source = pq.ParquetFile(str(path))
    table = source.read() if table is None else table
    meta = dict(source.metadata.metadata) if metadata is None else metadata
    pq.write_table(table.replace_schema_metadata(meta), str(out))
    return out


@pytest.fixture
def small_parquet(tmp_path: Path) -> Path:
    return save_trace(synthetic_trace(6, 3, 2, 8), tmp_path / "small.parquet")


def _footer(path: Path) -> dict:
    return json.loads(gzip.decompress(pq.ParquetFile(str(path)).metadata.metadata[METADATA_KEY]))


def _with_footer(body: dict) -> dict:
    return {METADATA_KEY: gzip.compress(json.dumps(body).encode())}


@pytest.mark.parametrize(
    "craft, message",
    [
        (lambda t, m: (t, {}), "without a specviz footer"),
        (lambda t, m: (t, {METADATA_KEY: b"not gzip"}), "not valid JSON"),
        (lambda t, m: (t, _with_footer({**m, "container_version": 99})), "container_version 99"),
        (lambda t, m: (t, _with_footer({**m, "header": {**m["header"], "batch_size": 0}})), "header.batch_size"),
        (lambda t, m: (t.drop_columns(["accepted"]), _with_footer(m)), "column 'accepted' missing"),
        (
            lambda t, m: (
                t.set_column(t.schema.get_field_index("accepted"), "accepted", t["accepted"].cast(pa.float64())),
                _with_footer(m),
            ),
            "column 'accepted': expected int64, got double",
        ),
        (lambda t, m: (t.append_column("evil", pa.array([1] * len(t))), _with_footer(m)), "unknown column 'evil'"),
        (
            lambda t, m: (
                t.set_column(t.schema.get_field_index("seq_id"), "seq_id", pa.array([999] * len(t))),
                _with_footer(m),
            ),
            "no sequence with id 999",
        ),
        (
            lambda t, m: (
                t.set_column(t.schema.get_field_index("verify_ms"), "verify_ms", pa.array([float("nan")] * len(t))),
                _with_footer(m),
            ),
            "verify_ms: number is not finite",
        ),
        (
            lambda t, m: (
                t.set_column(t.schema.get_field_index("accepted"), "accepted", pa.array([None] * len(t), pa.int64())),
                _with_footer(m),
            ),
            "column 'accepted': null value",
        ),
    ],
)
def test_crafted_parquet_is_refused_in_one_line(small_parquet: Path, tmp_path: Path, craft, message: str) -> None:
    table = pq.read_table(str(small_parquet)).replace_schema_metadata(None)
    crafted_table, meta = craft(table, _footer(small_parquet))
    # The sequences (container 2) sit beside the footer; the crafts above change other things.
    meta = {SEQUENCES_KEY: pq.ParquetFile(str(small_parquet)).metadata.metadata[SEQUENCES_KEY], **meta}
    bad = _rewrite(small_parquet, tmp_path / "bad.parquet", crafted_table, meta)
    with pytest.raises(TraceError) as info:
        load_trace(bad)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_truncated_parquet_is_refused(small_parquet: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(small_parquet.read_bytes()[:-100])
    with pytest.raises(TraceError, match="not a readable Parquet file"):
        load_trace(cut)
    with pytest.raises(ColumnarError):
        ParquetTrace(cut)


def test_table_schema_covers_every_record_field() -> None:
    from dataclasses import fields

    from specviz.trace.schema import RowRecord, StepRecord

    expected = {f.name for f in fields(RowRecord)} | {f.name for f in fields(StepRecord)} - {"rows"}
    assert set(TABLE_SCHEMA.names) == expected


def test_local_load_has_no_size_cap_but_uploads_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_trace(synthetic_trace(8, 4, 2, 8), tmp_path / "t.json")
    raw = path.read_bytes()
    monkeypatch.setattr(trace_io, "MAX_JSON_BYTES", len(raw) // 2)
    # The upload path keeps the byte cap (read at call time) and the semantic budget...
    with pytest.raises(TraceError, match="over the"):
        parse_trace_bytes(raw, "upload", max_bytes=trace_io.MAX_JSON_BYTES)
    # ...a local file is the user's own: no cap by default.
    assert len(load_trace(path).steps) > 0


def test_local_load_has_no_semantic_budget(tmp_path: Path) -> None:
    from specviz.trace.budget import Budget

    path = save_trace(synthetic_trace(8, 4, 2, 8), tmp_path / "t.json.gz")
    tiny = Budget(max_steps=2)
    with pytest.raises(TraceError, match="steps"):
        load_trace(path, budget=tiny)
    assert len(load_trace(path).steps) > 2


def test_convert_both_ways_and_refuses_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = TRACES / "default-eqspec-uniform-advance.json.gz"
    pq_path, back = tmp_path / "t.parquet", tmp_path / "back.json.gz"
    assert main(["convert", str(src), str(pq_path)]) == 0
    assert main(["convert", str(pq_path), str(back)]) == 0
    assert trace_to_json(load_trace(back)) == trace_to_json(load_trace(src))
    assert main(["convert", str(src), str(pq_path)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["convert", str(pq_path), str(tmp_path / "again.parquet")]) == 0  # streamed copy
    assert main(["convert", str(tmp_path / "missing.json"), str(tmp_path / "o.parquet")]) == 2


def test_parquet_upload_is_refused_with_one_line(small_parquet: Path) -> None:
    with pytest.raises(TraceError, match="read locally only"):
        load_trace(small_parquet, max_bytes=1 << 20)


def _without_timings(trace) -> list:
    steps = []
    for step in trace.steps:
        fields = {k: v for k, v in step.__dict__.items() if not k.endswith("_ms") and k != "rows"}
        steps.append((fields, [row.__dict__ for row in step.rows]))
    return steps


def test_record_writes_parquet_as_it_goes_and_check_streams_it(
    tiny_model_dirs: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = tiny_model_dirs
    common = ["record", "--target", target, "--draft", draft, "--batch-size", "4", "--draft-k", "3"]
    common += ["--max-new-tokens", "10", "--num-prompts", "6", "--fault", "column-positions"]
    assert main([*common, "--out", str(tmp_path / "r.parquet")]) == 0
    assert main([*common, "--out", str(tmp_path / "r.json.gz")]) == 0
    capsys.readouterr()
    columnar, plain = load_trace(tmp_path / "r.parquet"), load_trace(tmp_path / "r.json.gz")
    assert _without_timings(columnar) == _without_timings(plain)
    assert columnar.sequences == plain.sequences
    assert columnar.header.token_text == plain.header.token_text  # step tokens' text without the steps
    # `check` streams the Parquet file and says what it says of the JSON one.
    assert main(["check", "--json", str(tmp_path / "r.parquet")]) == 1
    streamed = json.loads(capsys.readouterr().out)
    assert main(["check", "--json", str(tmp_path / "r.json.gz")]) == 1
    whole = json.loads(capsys.readouterr().out)
    for report in (streamed, whole):
        report["metrics"] = {k: v for k, v in report["metrics"].items() if not k.endswith("_ms")}
        for key in ("decode_seconds", "tokens_per_second"):
            report["metrics"].pop(key)
    assert streamed == whole
    assert streamed["verdict"] == "desync"


def test_lazy_steps_index_and_stream_like_a_list(tmp_path: Path) -> None:
    from specviz.trace.io import open_trace

    trace = synthetic_trace(30, 8, 3, 20)
    writer = ParquetTraceWriter(tmp_path / "l.parquet", row_group_rows=40)
    for step in trace.steps:
        writer.add_step(step)
    writer.close(trace.header, trace.sequences)
    lazy = open_trace(tmp_path / "l.parquet").steps
    assert len(lazy) == len(trace.steps) and bool(lazy)
    assert [s.step for s in lazy] == [s.step for s in trace.steps]
    for i in (0, 7, len(trace.steps) - 1, -1, 13, 2):  # out of order: groups are read as needed
        assert lazy[i].step == trace.steps[i].step and lazy[i].rows == trace.steps[i].rows
    assert [s.step for s in lazy[3:9]] == [s.step for s in trace.steps[3:9]]
    with pytest.raises(IndexError):
        lazy[len(trace.steps)]
    assert lazy.records_row_finish() is True


def test_check_of_parquet_equals_check_of_json_on_every_bundled_fault(tmp_path: Path) -> None:
    from specviz.analysis.check import check_trace
    from specviz.trace.io import open_trace

    for path in sorted(TRACES.glob("*.json.gz")):
        trace = load_trace(path)
        out = save_trace(trace, tmp_path / f"{path.name}.parquet")
        assert check_trace(open_trace(out)).to_dict() == check_trace(trace).to_dict(), path.name
