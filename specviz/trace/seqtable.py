"""A run's sequences as one Arrow table: how the Parquet container (version 2) stores them.

Container version 1 kept the sequences as gzip JSON in the footer, beside the header. At 10,240
prompts of 256 new tokens that is 33 MB of JSON, and opening the file went mostly to parsing it
and checking every token list item by item (4.4 of 7.5 s CPU before the app showed a verdict).
Here the sequences are an Arrow IPC stream, one row per sequence, one column per `SequenceRecord`
field, with the types derived from the dataclass like the step table's: a list column's values
are one typed buffer, so "every token is an int in range" and "every margin is finite" are NumPy
reductions, and the lists come back as Python lists a slice of one `tolist()` at a time.

Equal token ids are made one int object (the JSON reader's object hook did the same): a token
list of 256 ids costs 8 bytes an id, not 36.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from specviz.errors import first_line
from specviz.trace.arrow import arrow_type, list_parts, one_chunk
from specviz.trace.schema import SequenceRecord
from specviz.trace.validate import MAX_ABS_INT, TraceError

SEQUENCE_FIELDS = tuple(f.name for f in dataclasses.fields(SequenceRecord))


def _sequence_schema() -> pa.Schema:
    hints = typing.get_type_hints(SequenceRecord)
    fields = []
    for name in SEQUENCE_FIELDS:
        kind, nullable = arrow_type(hints[name])
        fields.append(pa.field(name, kind, nullable=nullable))
    return pa.schema(fields)


SEQUENCE_SCHEMA = _sequence_schema()
_INT_LISTS = tuple(f.name for f in SEQUENCE_SCHEMA if f.type == pa.list_(pa.int64()))
_FLOAT_LISTS = tuple(f.name for f in SEQUENCE_SCHEMA if f.type == pa.list_(pa.float64()))
_SCALARS = tuple(f.name for f in SEQUENCE_SCHEMA if not pa.types.is_list(f.type))
# Every list column is one of the two kinds above: a new list field needs its reader here.
assert len(_INT_LISTS) + len(_FLOAT_LISTS) + len(_SCALARS) == len(SEQUENCE_FIELDS)


# ----------------------------------------------------------------------------- writing


def sequences_ipc(sequences: list[SequenceRecord]) -> bytes:
    """The sequences as an uncompressed Arrow IPC stream (the caller compresses it)."""
    table = pa.table({name: [getattr(s, name) for s in sequences] for name in SEQUENCE_FIELDS}, schema=SEQUENCE_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SEQUENCE_SCHEMA) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


# ----------------------------------------------------------------------------- reading


def sequences_from_ipc(data: pa.Buffer | bytes) -> list[SequenceRecord]:
    """The sequences of an IPC stream written by `sequences_ipc`, every value checked as the JSON
    loader checks it (types by the schema, then nulls, ranges, finiteness in bulk); TraceError
    names the first problem in one line."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data) if isinstance(data, bytes) else data)
        table = reader.read_all()
        table.validate(full=True)  # offsets inside their buffers, before NumPy reads through them
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TraceError(f"sequences: not a readable Arrow table ({first_line(exc)})") from None
    problem = _schema_difference(table.schema)
    if problem:
        raise TraceError(f"sequences: {problem}")
    columns: dict[str, list[Any]] = {}
    arrays = {name: one_chunk(table.column(name)) for name in SEQUENCE_FIELDS}
    for field in SEQUENCE_SCHEMA:
        if not field.nullable and arrays[field.name].null_count:
            raise TraceError(f"sequences.{field.name}: null value")
    for name in _SCALARS:
        columns[name] = arrays[name].to_pylist()
    bad = [i for i, v in enumerate(columns["seq_id"]) if abs(v) > MAX_ABS_INT]
    if bad:
        raise TraceError(f"sequences[{bad[0]}].seq_id: absurd value {columns['seq_id'][bad[0]]}")
    columns.update(_int_lists({name: arrays[name] for name in _INT_LISTS}))
    for name in _FLOAT_LISTS:
        columns[name] = _float_list_column(arrays[name], name)
    del table, arrays, reader, data  # the stream: 65 MB at 1M row-steps
    pa.default_memory_pool().release_unused()  # mimalloc keeps the freed stream otherwise: tens of MB
    return list(map(SequenceRecord, *(columns[name] for name in SEQUENCE_FIELDS)))


def _schema_difference(schema: pa.Schema) -> str | None:
    """What keeps `schema` from being read as the sequences, by name and type (column order and
    nullability flags are the writer's business: nulls are checked in the values)."""
    for field in SEQUENCE_SCHEMA:
        if field.name not in schema.names:
            return f"column {field.name!r} missing"
        if schema.get_all_field_indices(field.name) != [schema.get_field_index(field.name)]:
            return f"column {field.name!r} twice"
        actual = schema.field(field.name).type
        if actual != field.type:
            return f"column {field.name!r}: expected {field.type}, got {actual}"
    extra = sorted(set(schema.names) - set(SEQUENCE_FIELDS))
    return f"unknown column {extra[0]!r}" if extra else None


def _values(array: pa.ListArray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, flat values) of a list column, as NumPy views of its buffers (no pandas)."""
    parts = list_parts(array)
    if parts is None:
        raise TraceError(f"sequences.{name}: null inside a list")
    return parts


def _rows(array: pa.ListArray, offsets: np.ndarray, objects: np.ndarray) -> list[list[Any] | None]:
    """Each row's slice of `objects` as a list; a null row is None."""
    ends = offsets.tolist()
    rows: list[Any] = [objects[a:b].tolist() for a, b in zip(ends, ends[1:])]
    if array.null_count:
        for i, valid in enumerate(array.is_valid().to_pylist()):
            if not valid:
                rows[i] = None
    return rows


def _int_lists(arrays: dict[str, pa.ListArray]) -> dict[str, list[list[int] | None]]:
    """The token list columns, equal ids one shared int object across all of them."""
    parts = {name: _values(array, name) for name, array in arrays.items()}
    for name, (_, flat) in parts.items():
        if flat.size and (flat.max() > MAX_ABS_INT or flat.min() < -MAX_ABS_INT):
            raise TraceError(f"sequences.{name}: absurd token id {int(flat[np.abs(flat) > MAX_ABS_INT][0])}")
    share = _shared_ints([flat for _, flat in parts.values()])
    # A column at a time, so only one column's object array exists at once (tens of MB at 1M row-steps).
    return {name: _rows(arrays[name], offsets, share(flat)) for name, (offsets, flat) in parts.items()}


def _shared_ints(columns: list[np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """A function that turns one of `columns` into an object array in which equal ids, across all
    the columns, are the same Python int."""
    sized = [flat for flat in columns if flat.size]
    if not sized:
        return lambda flat: flat.astype(object)
    low, high = min(int(f.min()) for f in sized), max(int(f.max()) for f in sized)
    if high - low <= max(1 << 18, sum(f.size for f in sized)):  # a vocabulary: one int per possible id
        table = np.array(range(low, high + 1), dtype=object)
        return lambda flat: table[flat - low]
    unique = np.unique(np.concatenate(sized))  # ids scattered far apart: sort once
    table = np.array(unique.tolist(), dtype=object)
    return lambda flat: table[np.searchsorted(unique, flat)]


def _float_list_column(array: pa.ListArray, name: str) -> list[list[float] | None]:
    offsets, flat = _values(array, name)
    finite = np.isfinite(flat)
    if not finite.all():
        raise TraceError(f"sequences.{name}: number is not finite")
    return _rows(array, offsets, flat)
