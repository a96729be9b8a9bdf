"""Arrow columns of a Parquet trace as Python values, and the checks a row group can take a column
at a time. Kept free of pandas: `Array.to_numpy`, `pc.is_in` and compares with Python scalars
import it (seconds of a short `check`), so values go through NumPy views of the buffers.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specviz.trace.validate import MAX_LENGTH, ROW_COUNTS


def arrow_type(hint: Any) -> tuple[pa.DataType, bool]:
    """(arrow type, nullable) of one dataclass field's type hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return arrow_type(inner[0])[0], True
    if hint is bool:
        return pa.bool_(), False
    if hint is int:
        return pa.int64(), False
    if hint is float:
        return pa.float64(), False
    if hint is str:
        return pa.string(), False
    if origin is list:
        return pa.list_(arrow_type(args[0])[0]), False
    raise TypeError(f"no column type for {hint}")


def pylist(column: pa.ChunkedArray) -> list[Any]:
    """A column as Python values, 3-5x faster than `to_pylist` for list columns: the flat values
    are converted once through NumPy and each row is a slice of them."""
    out: list[Any] = []
    for chunk in column.chunks:
        out.extend(_chunk_values(chunk))
    return out


_NUMPY_TYPES = {pa.int64(): "<i8", pa.int32(): "<i4", pa.float64(): "<f8"}


def _chunk_values(array: pa.Array) -> list[Any]:
    if array.null_count == len(array):  # an optional field nobody recorded
        return [None] * len(array)
    if pa.types.is_list(array.type):
        offsets = _primitive(array.offsets)
        values = _chunk_values(array.values)
        rows = list(map(values.__getitem__, map(slice, offsets, offsets[1:])))
    elif array.null_count or not (array.type in _NUMPY_TYPES or pa.types.is_boolean(array.type)):
        return array.to_pylist()
    else:
        rows = _primitive(array)
    if array.null_count:
        nulls = array.is_null()
        for i, null in enumerate(_primitive(nulls)):
            if null:
                rows[i] = None
    return rows


def _primitive(array: pa.Array) -> list[Any]:
    """A null-free numeric or boolean array as a list, straight from its data buffer through NumPy
    (`Array.to_numpy` would import pandas, seconds of a short `check`)."""
    n, buffer = len(array), array.buffers()[1]
    if pa.types.is_boolean(array.type):  # bit-packed, least significant bit first
        bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")
        return bits[array.offset : array.offset + n].astype(bool).tolist()
    dtype = np.dtype(_NUMPY_TYPES[array.type])
    return np.frombuffer(buffer, dtype=dtype, count=n, offset=array.offset * dtype.itemsize).tolist()


# What `validate.check_steps` checks row by row, checked a column at a time (C loops, not Python):
# a row group that passes every one of these passes `check_steps`; one that fails is handed to
# `check_steps`, whose message names the first bad field.
_COUNT_COLUMNS = (*ROW_COUNTS, "cache_len", "query_len", "step")
_TIME_COLUMNS = ("draft_ms", "verify_ms", "align_ms", "total_ms")


def columns_valid(table: pa.Table, seq_ids: np.ndarray, previous_step: int) -> bool:
    for name in _COUNT_COLUMNS:
        bounds = pc.min_max(table[name]).as_py()
        if bounds["min"] is not None and not (0 <= bounds["min"] and bounds["max"] <= MAX_LENGTH):
            return False
    for name in _TIME_COLUMNS:
        if not pc.all(pc.is_finite(table[name])).as_py():
            return False
    lists = pc.list_flatten(table["draft_kv_lens"])
    if len(lists) and not 0 <= pc.min(lists).as_py() <= pc.max(lists).as_py() <= MAX_LENGTH:
        return False
    for name in ("seq_id", "write_seq"):  # np.isin: pc.is_in would import pandas (seconds of a check)
        if not np.isin(_int64s(table[name]), seq_ids).all():
            return False
    if not _runs_valid(table["mask_rle"]) or not _reasons_valid(table["finish_reason"]):
        return False
    numbers = _int64s(table["step"])
    return bool(numbers.size == 0 or (numbers[0] > previous_step and (np.diff(numbers) >= 0).all()))


def _runs_valid(column: pa.ChunkedArray) -> bool:
    """Every mask run is a [0 or 1, count] pair with count in 0..MAX_LENGTH."""
    runs = pc.list_flatten(column)
    if not len(runs):
        return True
    lengths = (
        pc.list_value_length(runs).combine_chunks() if isinstance(runs, pa.ChunkedArray) else pc.list_value_length(runs)
    )
    if not (np.frombuffer(lengths.buffers()[1], dtype="<i4", count=len(lengths), offset=lengths.offset * 4) == 2).all():
        return False
    values = _int64s(pc.list_flatten(runs))
    kinds, counts = values[0::2], values[1::2]
    return bool(((kinds == 0) | (kinds == 1)).all() and (counts >= 0).all() and (counts <= MAX_LENGTH).all())


def _int64s(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A null-free int64 column as a NumPy view of its buffer (no pandas import)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.frombuffer(array.buffers()[1], dtype="<i8", count=len(array), offset=array.offset * 8)


def _reasons_valid(column: pa.ChunkedArray) -> bool:
    # A set of at most a few values; comparing with a Python string would import pandas.
    return set(pc.unique(pc.drop_null(column)).to_pylist()) <= {"eos", "length"}


# ----------------------------------------------------------------------------- NumPy views for the vectorised check
# Null slots of a nullable column hold whatever the buffer holds: read them with `valid`.


def one_chunk(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def numbers(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An int64, float64 or boolean column as a NumPy array of that type, `[rows]`."""
    array = one_chunk(column)
    n, buffer = len(array), array.buffers()[1]
    if pa.types.is_boolean(array.type):
        if buffer is None:
            return np.zeros(n, dtype=bool)
        bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")
        return bits[array.offset : array.offset + n].astype(bool)
    dtype = "<f8" if pa.types.is_floating(array.type) else "<i8"
    if buffer is None or n == 0:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(buffer, dtype=dtype, count=n, offset=array.offset * 8)


def valid(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """True where the column holds a value, `[rows]`."""
    array = one_chunk(column)
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return numbers(pc.is_valid(array))


def list_parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """A list<int64> or list<double> column as (offsets `[rows + 1]`, flat values): row i is
    values[offsets[i]:offsets[i + 1]] (null rows included, read them with `valid`). None if a list
    holds a null value."""
    array = one_chunk(column)
    values = array.values
    if values.null_count:
        return None
    if len(array) == 0:  # a writer may leave a column without rows without an offsets buffer
        return np.zeros(1, dtype=np.int64), numbers(values)
    offsets = np.frombuffer(array.buffers()[1], dtype="<i4", count=len(array) + 1, offset=array.offset * 4)
    return offsets.astype(np.int64), numbers(values)


def run_parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A mask_rle column (list of [value, count] pairs, checked by `columns_valid`) as (offsets into the
    runs `[rows + 1]`, run values, run counts). None if a run or a pair is null."""
    array = one_chunk(column)
    if array.null_count:
        return None
    offsets = np.frombuffer(array.buffers()[1], dtype="<i4", count=len(array) + 1, offset=array.offset * 4)
    pairs = list_parts(array.values)
    if pairs is None or array.values.null_count:
        return None
    starts, flat = pairs
    if len(starts) > 1 and not (np.diff(starts) == 2).all():
        return None
    first = starts[:-1]
    return offsets.astype(np.int64), flat[first], flat[first + 1]


def string_lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Characters of each string, 0 where null (`finish_reason`: "eos" 3, "length" 6), `[rows]`."""
    array = one_chunk(column)
    lengths = pc.utf8_length(array)
    buffer = lengths.buffers()[1]
    if buffer is None or not len(lengths):
        return np.zeros(len(lengths), dtype=np.int64)
    values = np.frombuffer(buffer, dtype="<i4", count=len(lengths), offset=lengths.offset * 4)
    return np.where(valid(array), values, 0).astype(np.int64)
