"""Reading the columnar trace (`columnar.py` says what one holds): `ParquetTrace` opens a file,
checks its footer (header, sequences) within the file limits before inflating anything, and reads
the steps a row group at a time; `ParquetSteps` is those steps as a lazy, indexable sequence.
"""

from __future__ import annotations

import bisect
import collections.abc
import functools
import itertools
import json
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specviz.errors import first_line
from specviz.files import InflatesTooFar, inflate_bounded
from specviz.trace.arrow import columns_valid
from specviz.trace.arrow import numbers as numbers_of
from specviz.trace.budget import NO_LIMITS_HINT, FileLimits, file_limits, json_parse_bytes
from specviz.trace.columnar import (
    CONTAINER,
    MAX_SEQUENCES_RATIO,
    METADATA_KEY,
    MIN_SEQUENCES_BOUND,
    READABLE_CONTAINER_VERSIONS,
    REQUIRED_ROW_COLUMNS,
    SEQUENCES_KEY,
    TABLE_SCHEMA,
    ColumnarError,
    check_columns,
    steps_of_table,
    with_optional_columns,
)
from specviz.trace.schema import (
    Header,
    SequenceRecord,
    StepRecord,
    Trace,
)
from specviz.trace.seqtable import sequences_from_ipc
from specviz.trace.validate import (
    TraceError,
    check_sequences,
    check_steps,
    header_and_sequences_from_dict,
    header_from_dict,
)


class ParquetTrace:
    """An open Parquet trace: header and sequences in memory, steps read a row group at a time.

    Validation of the footer (header, sequences) reuses the JSON loader's field-by-field checks;
    the table's column types are checked once against `TABLE_SCHEMA`, and each row group's values
    by the same structural checks as a JSON trace's steps when it is read.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file = pq.ParquetFile(str(self.path))
            size = self.path.stat().st_size
        except (OSError, pa.ArrowException) as exc:
            raise ColumnarError(f"{self.path.name}: not a readable Parquet file ({_quoted(exc, self.path)})") from None
        limits = file_limits()
        self.header, self.sequences, group_steps = _read_footer(self._file, self.path, limits, size)
        check_columns(self._file.schema_arrow, self.path)
        if limits is not None:
            _check_declared_sizes(self._file, self.path, limits.decoded_bound(size))
        self.num_row_groups = self._file.num_row_groups
        self.num_rows = self._file.metadata.num_rows
        self.seq_ids = {seq.seq_id for seq in self.sequences}
        self._seq_id_array = np.array(sorted(self.seq_ids), dtype=np.int64)
        if group_steps is None or len(group_steps) != self.num_row_groups:
            group_steps = [len(self._decode(g)) for g in range(self.num_row_groups)]  # one scan
        self.group_starts = list(itertools.accumulate(group_steps, initial=0))  # step index of each group
        self._cache: tuple[int, list[StepRecord]] | None = None  # the last row group read
        # The last row group `read_step` read: its validated columns and the first row of each step.
        self._table_cache: tuple[int, pa.Table, np.ndarray] | None = None

    def step_range(self, group: int) -> tuple[int, int] | None:
        """(first, last) `step` number of one row group, from its statistics; None if absent."""
        column = self._file.metadata.row_group(group).column(TABLE_SCHEMA.get_field_index("step"))
        stats = column.statistics
        if stats is None or not stats.has_min_max:
            return None
        return int(stats.min), int(stats.max)

    def _decode(self, group: int) -> list[StepRecord]:
        return steps_of_table(self._read_table(group), self.path, group)

    def _read_table(self, group: int) -> pa.Table:
        try:
            return with_optional_columns(self._file.read_row_group(group, use_threads=False))
        except (OSError, pa.ArrowException) as exc:
            reason = _quoted(exc, self.path)
            raise ColumnarError(f"{self.path.name}: row group {group}: unreadable ({reason})") from None

    def read_group(self, group: int) -> list[StepRecord]:
        """One row group's steps, checked like a JSON trace's (the previous group's last step
        number comes from its statistics, so groups can be read in any order)."""
        if self._cache is not None and self._cache[0] == group:
            return self._cache[1]
        table = self._read_table(group)
        steps = steps_of_table(table, self.path, group)
        if not columns_valid(table, self._seq_id_array, self._previous_step(group)):
            try:  # something is wrong: the row-by-row checks name the first bad field
                check_steps(steps, self.seq_ids, self._previous_step(group), first_index=self.group_starts[group])
            except TraceError as exc:
                raise ColumnarError(f"{self.path}: {exc}") from None
        self._check_step_count(group, len(steps))
        self._cache = (group, steps)
        return steps

    def read_step(self, index: int) -> StepRecord:
        """Step `index` alone: its row group's columns are read and validated as `read_table` does
        (and kept, one group), and only the step's own rows are decoded into records."""
        group = bisect.bisect_right(self.group_starts, index) - 1
        k = index - self.group_starts[group]
        if self._cache is not None and self._cache[0] == group:
            return self._cache[1][k]
        if self._table_cache is None or self._table_cache[0] != group:
            table = self.read_table(group)
            numbers = numbers_of(table.column("step"))
            self._table_cache = (group, table, np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]]))
        _, table, starts = self._table_cache
        end = int(starts[k + 1]) if k + 1 < len(starts) else table.num_rows
        rows = table.take(pa.array(np.arange(int(starts[k]), end)))  # compact: only these rows' lists
        return steps_of_table(rows, self.path, group)[0]

    def read_table(self, group: int) -> pa.Table:
        """One row group as Arrow columns, validated as `read_group` validates its steps (a group
        the column checks doubt is decoded and checked row by row, which names the bad field)."""
        table = self._read_table(group)
        nulls = any(table.column(name).null_count for name in REQUIRED_ROW_COLUMNS)
        if nulls or not columns_valid(table, self._seq_id_array, self._previous_step(group)):
            self.read_group(group)  # raises ColumnarError naming the problem, if there is one
            return table
        numbers = numbers_of(table.column("step"))
        self._check_step_count(group, int(numbers.size and 1 + np.count_nonzero(numbers[1:] != numbers[:-1])))
        return table

    def _previous_step(self, group: int) -> int:
        if group == 0:
            return -1
        bounds = self.step_range(group - 1)
        return bounds[1] if bounds is not None else -1

    def _check_step_count(self, group: int, steps: int) -> None:
        if group + 1 < len(self.group_starts) and steps != self.group_starts[group + 1] - self.group_starts[group]:
            raise ColumnarError(f"{self.path}: row group {group}: holds {steps} steps, the footer says otherwise")

    def iter_steps(self) -> Iterator[StepRecord]:
        """Every step in order, one row group in memory at a time."""
        for group in range(self.num_row_groups):
            yield from self.read_group(group)

    @property
    def steps(self) -> ParquetSteps:
        return ParquetSteps(self)

    def open(self) -> Trace:
        """A Trace whose `steps` are read from disk a row group at a time as they are used."""
        return Trace(header=self.header, steps=self.steps, sequences=self.sequences)  # type: ignore[arg-type]

    def read(self) -> Trace:
        """The whole trace in memory."""
        return Trace(header=self.header, steps=list(self.iter_steps()), sequences=self.sequences)


class ParquetSteps(collections.abc.Sequence):
    """The steps of a Parquet trace as a read-only sequence: iterating streams the row groups,
    indexing reads the one row group that holds the step (the last one read is kept) and decodes
    that step only; a slice decodes the row groups it spans."""

    def __init__(self, source: ParquetTrace) -> None:
        self._source = source

    @property
    def source(self) -> ParquetTrace:
        return self._source

    def __len__(self) -> int:
        return self._source.group_starts[-1]

    def __iter__(self) -> Iterator[StepRecord]:
        return self._source.iter_steps()

    def __getitem__(self, index):  # type: ignore[override]
        starts = self._source.group_starts
        if isinstance(index, slice):  # whole row groups decoded, each once
            return [
                self._source.read_group(g)[i - starts[g]]
                for i in range(*index.indices(len(self)))
                for g in (bisect.bisect_right(starts, i) - 1,)
            ]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("step index out of range")
        return self._source.read_step(index)  # one row group read, one step decoded

    def __bool__(self) -> bool:
        return len(self) > 0

    def column_groups(self) -> Iterator[tuple[int, pa.Table, Callable[[], list[StepRecord]]]]:
        """Each row group in order, for checks that take whole columns: (index of its first step, its
        validated Arrow columns, a function that returns its steps decoded as records)."""
        source = self._source
        for group in range(source.num_row_groups):
            yield source.group_starts[group], source.read_table(group), functools.partial(source.read_group, group)
            pa.default_memory_pool().release_unused()  # mimalloc keeps freed pages otherwise: tens of MB

    def records_row_finish(self) -> bool:
        """Whether any row records a finish (the checker asks before its walk): two columns."""
        table = self._source._file.read(columns=["finished", "finish_reason"], use_threads=False)
        return bool(pc.any(table["finished"]).as_py()) or table["finish_reason"].null_count < len(table)


def _read_footer(
    file: pq.ParquetFile, path: Path, limits: FileLimits | None = None, size: int = 0
) -> tuple[Header, list[SequenceRecord], list[int] | None]:
    metadata = file.metadata.metadata or {}
    raw = metadata.get(METADATA_KEY)
    if raw is None:
        raise ColumnarError(f"{path}: Parquet file without a specviz footer (not a specviz trace)")
    bound = limits.decoded_bound(size) if limits is not None else None
    try:
        text = _gunzip_footer(raw, bound).decode("utf-8")  # the bytes go before parsing: one copy, not two
    except InflatesTooFar:
        raise ColumnarError(_too_big(path, "its specviz footer inflates", bound or 0)) from None
    except (ValueError, OSError, EOFError, zlib.error):
        raise ColumnarError(f"{path}: specviz footer is not valid JSON") from None
    if bound is not None and (cost := json_parse_bytes(text)) > bound:
        raise ColumnarError(_too_big(path, f"its specviz footer would parse into ~{cost >> 20} MiB", bound))
    try:
        body = json.loads(text, object_hook=_shared_tokens())
    except (ValueError, RecursionError):
        raise ColumnarError(f"{path}: specviz footer is not valid JSON") from None
    if not isinstance(body, dict) or body.get("container") != CONTAINER:
        raise ColumnarError(f"{path}: specviz footer: expected container 'parquet'")
    version = body.get("container_version")
    if version not in READABLE_CONTAINER_VERSIONS or type(version) is not int:
        readable = " and ".join(map(str, READABLE_CONTAINER_VERSIONS))
        raise ColumnarError(f"{path}: container_version {version!r}; this specviz reads Parquet containers {readable}")
    fields = {k: body.get(k) for k in ("format", "header", "sequences")}
    try:
        if version == 1:
            header, sequences = header_and_sequences_from_dict(fields)
        else:
            header = header_from_dict(fields)
            sequences = sequences_from_ipc(_inflate_sequences(metadata.get(SEQUENCES_KEY), body.get("sequences_bytes")))
            check_sequences(sequences)
    except TraceError as exc:
        raise ColumnarError(f"{path}: {exc}") from None
    counts = body.get("row_group_steps")
    valid = isinstance(counts, list) and all(type(c) is int and 0 < c <= 10_000_000 for c in counts)
    return header, sequences, counts if valid else None


def _inflate_sequences(raw: bytes | None, size: Any) -> pa.Buffer:
    """The sequences' Arrow stream, inflated to the size the footer declares, checked first."""
    if raw is None:
        raise TraceError("sequences: missing from the footer (key 'specviz.sequences')")
    if type(size) is not int or not 0 < size <= max(len(raw) * MAX_SEQUENCES_RATIO, MIN_SEQUENCES_BOUND):
        raise TraceError(f"sequences_bytes: {size!r} is not a size {len(raw):,} compressed bytes can hold")
    try:
        data = pa.decompress(raw, decompressed_size=size, codec="zstd", asbytes=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TraceError(f"sequences: not zstd-compressed data of {size:,} bytes ({first_line(exc)})") from None
    return data


_TOKEN_LISTS = ("prompt_ids", "output_ids", "reference_ids")


def _shared_tokens() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A `json.loads` object hook that makes equal token ids of the sequences one int object: json
    makes a new int for each number (36 bytes with its pointer, 8 when shared), and the footer holds
    every sequence's prompt, output and reference (2.4 of 3.9 KB per 256-token sequence in memory)."""
    ids: dict[int, int] = {}

    def hook(obj: dict[str, Any]) -> dict[str, Any]:
        for key in _TOKEN_LISTS:
            tokens = obj.get(key)
            # Only lists of plain ints: a bool is equal to 0 or 1 and must stay a bool (refused later).
            if type(tokens) is list and tokens and set(map(type, tokens)) == {int}:
                obj[key] = list(map(ids.setdefault, tokens, tokens))
        return obj

    return hook


def _gunzip_footer(raw: bytes, bound: int | None = None) -> bytes:
    """Inflate the footer with a bound: a crafted file's tiny footer must not inflate to gigabytes."""
    limit = max(len(raw) * 200, 64 << 20)
    return inflate_bounded(raw, limit if bound is None else min(limit, bound))


def _too_big(path: Path, what: str, bound: int) -> str:
    """One line, the file named (not its folders): a part of a local file over `FileLimits`."""
    return f"{path.name}: {what}, more than the {bound >> 20} MiB this file may decode to; {NO_LIMITS_HINT}"


def _quoted(exc: BaseException, path: Path) -> str:
    """A library's message about `path`, its folders cut (Arrow names the full path it opened)."""
    text = first_line(exc)
    for spelled in {str(path.resolve()), str(path.absolute()), str(path)}:
        text = text.replace(spelled, path.name)
    return text


def _check_declared_sizes(file: pq.ParquetFile, path: Path, bound: int) -> None:
    """Every row group decodes to at most `bound` bytes, by what the file itself declares: its
    columns' uncompressed sizes, and a dictionary-encoded string column's values as the rows use
    them (a 1 MB string in the dictionary, used by 20,000 rows, is 20 GB of strings once read).
    The dictionaries are read as dictionaries (indices and values, nothing expanded)."""
    metadata = file.metadata
    dictionary_strings: set[str] = set()
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        if row_group.total_byte_size > bound:
            what = f"row group {group} declares {row_group.total_byte_size >> 20} MiB of columns"
            raise ColumnarError(_too_big(path, what, bound))
        for index in range(row_group.num_columns):
            column = row_group.column(index)
            if column.physical_type == "BYTE_ARRAY" and column.has_dictionary_page:
                dictionary_strings.add(column.path_in_schema)
    if not dictionary_strings:
        return
    names = sorted(dictionary_strings)
    try:
        encoded = pq.ParquetFile(str(path), read_dictionary=names)
        for group in range(metadata.num_row_groups):
            table = encoded.read_row_group(group, columns=names, use_threads=False)
            expanded = sum(_expanded_bytes(chunk) for name in names for chunk in table.column(name).chunks)
            if metadata.row_group(group).total_byte_size + expanded > bound:
                what = f"row group {group}'s strings expand to {expanded >> 20} MiB"
                raise ColumnarError(_too_big(path, what, bound))
    except (OSError, pa.ArrowException) as exc:
        raise ColumnarError(f"{path.name}: not a readable Parquet file ({_quoted(exc, path)})") from None


def _expanded_bytes(chunk: pa.Array) -> int:
    """The bytes a (dictionary-encoded) string array takes once every row holds its value."""
    if not pa.types.is_dictionary(chunk.type):
        return chunk.nbytes
    lengths = pc.binary_length(chunk.dictionary).take(chunk.indices)
    return int(pc.sum(lengths).as_py() or 0)
