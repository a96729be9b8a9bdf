"""Parquet container 2 stores the sequences as an Arrow table beside the footer: they read back
exactly (sliced tables, nulls, shared ids), container 1 files (sequences as footer JSON) are still
read, and a crafted sequences table or size is refused in one line, before it can allocate more
than the footer declares."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specviz.trace.columnar import METADATA_KEY, SEQUENCES_KEY
from specviz.trace.columnar_read import ParquetTrace
from specviz.trace.io import TraceError, load_trace, save_trace, trace_to_json
from specviz.trace.schema import SequenceRecord
from specviz.trace.seqtable import SEQUENCE_SCHEMA, sequences_from_ipc, sequences_ipc
from specviz.trace.synthetic import synthetic_trace


def _records() -> list[SequenceRecord]:
    return [
        SequenceRecord(1, "a", [5, 70_000, 5], [70_000, 9], "x", [70_000, 9], [0.5, 2.0], "eos"),
        SequenceRecord(2, "b", [3], [], "", None, None, None),  # nothing decoded, no reference
        SequenceRecord(7, "c\u00e9", [70_000], [1, 2, 3], "y", [1, 2, 4], [1.5, -0.0, 3.25], "length"),
    ]


def test_sequences_round_trip_and_share_equal_ids() -> None:
    records = _records()
    back = sequences_from_ipc(sequences_ipc(records))
    assert back == records
    # One int object for each token id, whichever list it is in (8 bytes an id, not 36).
    assert back[0].prompt_ids[1] is back[0].output_ids[0] is back[2].prompt_ids[0]
    assert all(type(v) is int for s in back for v in s.prompt_ids + s.output_ids)
    assert all(type(v) is float for s in back for v in s.reference_margins or [])


def test_a_sliced_table_reads_its_own_rows() -> None:
    records = _records()
    table = pa.table({f: [getattr(s, f) for s in records] for f in SEQUENCE_SCHEMA.names}, schema=SEQUENCE_SCHEMA)
    assert sequences_from_ipc(_ipc(table.slice(1))) == records[1:]
    assert sequences_from_ipc(_ipc(table.slice(0, 0))) == []


def test_far_apart_ids_are_shared_too() -> None:
    record = SequenceRecord(1, "p", [2, 1_000_000_000], [1_000_000_000, -5], "", None, None, None)
    (back,) = sequences_from_ipc(sequences_ipc([record]))
    assert back == record and back.prompt_ids[1] is back.output_ids[0]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _table(**changes: list) -> pa.Table:
    records = _records()
    columns = {f: [getattr(s, f) for s in records] for f in SEQUENCE_SCHEMA.names}
    columns.update(changes)
    return pa.table(columns)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"not an arrow stream", "not a readable Arrow table"),
        (_ipc(_table().drop_columns(["output_text"])), "column 'output_text' missing"),
        (_ipc(_table().append_column("evil", pa.array([1, 2, 3]))), "unknown column 'evil'"),
        (
            _ipc(_table(prompt_ids=pa.array([[1], [2], [3]], pa.list_(pa.int32())))),
            "column 'prompt_ids': expected list<item: int64>, got list<item: int32>",
        ),
        (_ipc(_table(seq_id=pa.array([1, None, 3], pa.int64()))), "null value"),
        (_ipc(_table(prompt_ids=[[1], [2, None], [3]])), "sequences.prompt_ids: null inside a list"),
        (_ipc(_table(output_ids=[[1], [10**15], [3]])), "sequences.output_ids: absurd token id 1000000000000000"),
        (_ipc(_table(seq_id=[1, 10**15, 3])), "seq_id: absurd value"),
        (_ipc(_table(reference_margins=[[0.5, float("nan")], None, [1.0, 2.0, 3.0]])), "number is not finite"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_crafted_sequences_are_refused_in_one_line(data: bytes, message: str) -> None:
    with pytest.raises(TraceError) as info:
        sequences_from_ipc(data)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return save_trace(synthetic_trace(6, 3, 2, 8), tmp_path / "small.parquet")


def _rewrite(source: Path, out: Path, body_changes: dict | None = None, sequences: bytes | None = None) -> Path:
    """`source` with its footer body changed and/or its sequences value replaced."""
    file = pq.ParquetFile(str(source))
    meta = dict(file.metadata.metadata)
    body = json.loads(gzip.decompress(meta[METADATA_KEY]))
    body.update(body_changes or {})
    meta[METADATA_KEY] = gzip.compress(json.dumps(body).encode())
    if sequences is not None:
        meta[SEQUENCES_KEY] = sequences
    pq.write_table(file.read().replace_schema_metadata(meta), str(out))
    return out


def _stream_size(path: Path) -> int:
    return json.loads(gzip.decompress(pq.ParquetFile(str(path)).metadata.metadata[METADATA_KEY]))["sequences_bytes"]


@pytest.mark.parametrize(
    "changes, message",
    [
        (lambda size: ({"sequences_bytes": size + 1}, None), "not zstd-compressed data"),
        (lambda size: ({"sequences_bytes": size - 1}, None), "not zstd-compressed data"),
        (lambda size: ({"sequences_bytes": 10**12}, None), "is not a size"),
        (lambda size: ({"sequences_bytes": "12"}, None), "is not a size"),
        (lambda size: ({}, pa.compress(b"x" * 100, codec="zstd", asbytes=True)), "not zstd-compressed data"),
        (lambda size: ({"sequences_bytes": 100}, pa.compress(b"x" * 100, codec="zstd", asbytes=True)), "Arrow"),
        (
            lambda size: (
                {"sequences_bytes": len(ipc := sequences_ipc(_records()[:1] * 2))},
                pa.compress(ipc, codec="zstd", asbytes=True),
            ),
            "duplicate sequence id 1",
        ),
    ],
)
def test_crafted_sequences_in_a_file_are_refused(small: Path, tmp_path: Path, changes, message: str) -> None:
    body, sequences = changes(_stream_size(small))
    bad = _rewrite(small, tmp_path / "bad.parquet", body, sequences)
    with pytest.raises(TraceError) as info:
        load_trace(bad)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_missing_sequences_are_refused(small: Path, tmp_path: Path) -> None:
    file = pq.ParquetFile(str(small))
    meta = {k: v for k, v in file.metadata.metadata.items() if k != SEQUENCES_KEY}
    pq.write_table(file.read().replace_schema_metadata(meta), str(tmp_path / "bad.parquet"))
    with pytest.raises(TraceError, match="missing from the footer"):
        load_trace(tmp_path / "bad.parquet")


def test_container_1_files_are_still_read(small: Path, tmp_path: Path) -> None:
    """Container 1 (before 2026-12-01): the sequences were JSON in the footer body."""
    trace = load_trace(small)
    file = pq.ParquetFile(str(small))
    body = json.loads(gzip.decompress(file.metadata.metadata[METADATA_KEY]))
    body = {k: v for k, v in body.items() if k != "sequences_bytes"}
    body.update(container_version=1, sequences=[dataclasses.asdict(s) for s in trace.sequences])
    meta = {METADATA_KEY: gzip.compress(json.dumps(body).encode())}
    old = tmp_path / "v1.parquet"
    pq.write_table(file.read().replace_schema_metadata(meta), str(old))
    assert trace_to_json(load_trace(old)) == trace_to_json(trace)
    assert ParquetTrace(old).sequences == trace.sequences
    # `specviz convert` rewrites it in the current container.
    from specviz.cli import main

    assert main(["convert", str(old), str(tmp_path / "v2.parquet")]) == 0
    meta = pq.ParquetFile(str(tmp_path / "v2.parquet")).metadata.metadata
    assert json.loads(gzip.decompress(meta[METADATA_KEY]))["container_version"] == 2 and SEQUENCES_KEY in meta
    assert trace_to_json(load_trace(tmp_path / "v2.parquet")) == trace_to_json(trace)


def test_footer_validates_against_the_documented_schema(small: Path, tmp_path: Path) -> None:
    """docs/trace.schema.json's ParquetFooter describes what the writer puts in the footer, both
    containers; the Arrow table's columns are the SequenceRecord fields it documents."""
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "trace.schema.json").read_text())
    footer = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/ParquetFooter"})
    body = json.loads(gzip.decompress(pq.ParquetFile(str(small)).metadata.metadata[METADATA_KEY]))
    footer.validate(body)
    assert body["container_version"] == 2 and "sequences" not in body
    old = {**{k: v for k, v in body.items() if k != "sequences_bytes"}, "container_version": 1}
    assert not footer.is_valid(old)  # container 1 needs its sequences
    footer.validate({**old, "sequences": [dataclasses.asdict(s) for s in load_trace(small).sequences]})
    assert set(schema["$defs"]["SequenceRecord"]["properties"]) == set(SEQUENCE_SCHEMA.names)


def test_mangled_streams_are_refused_or_read_never_crash() -> None:
    """Random byte changes and cuts of a real stream (23,000 more tried with seeds 1 and 7: no
    other outcome): each either reads, or is one TraceError line; nothing else escapes."""
    import random

    stream = sequences_ipc(synthetic_trace(8, 4, 2, 6).sequences)
    rng = random.Random(0)
    refused = 0
    for _ in range(300):
        data = bytearray(stream)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.2:
            data = data[: rng.randrange(len(data))]
        try:
            sequences_from_ipc(bytes(data))
        except TraceError as exc:
            refused += 1
            assert "\n" not in str(exc)
    assert refused > 150  # most changes break the stream; the rest change values a check allows
