"""The columnar trace container: the same schema as the JSON trace, stored as Parquet.

JSON is the interchange format the docs teach and the public upload accepts; Parquet is what big
runs use. One file holds:
- one table of *row-steps* (one table row per batch row per step), step fields repeated on each
  of the step's rows, per-row lists (`draft_tokens`, `position_ids`, `mask_rle`...) as list
  columns. A row group always holds whole steps, in execution order, so a reader can stream the
  steps a row group at a time and the step range of each row group is in its statistics;
- the header and the sequences, as JSON under the footer's key `specviz` (the header carries the
  token text). They are small next to the steps and known only when the run ends.

The table's columns are derived from `RowRecord` and `StepRecord`, so a field added to the schema
becomes a column without touching this file. A writer that is interrupted in Python (Ctrl-C, an
exception) still closes the file with `header.complete = false`, readable up to its last finished
row group; a process killed outright leaves no footer, and the file is refused as truncated.
"""

from __future__ import annotations

import bisect
import collections.abc
import dataclasses
import functools
import gzip
import itertools
import json
import os
import stat
import tempfile
import typing
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specviz.errors import first_line
from specviz.files import InflatesTooFar, inflate_bounded, umask_file_mode
from specviz.trace.arrow import arrow_type, columns_valid, pylist
from specviz.trace.arrow import numbers as numbers_of
from specviz.trace.budget import NO_LIMITS_HINT, FileLimits, file_limits, json_parse_bytes
from specviz.trace.schema import (
    FORMAT_NAME,
    TREE_ROW_FIELDS,
    V4_ROW_FIELDS,
    Header,
    RowRecord,
    SequenceRecord,
    StepRecord,
    Trace,
    json_fields,
)
from specviz.trace.seqtable import sequences_from_ipc, sequences_ipc
from specviz.trace.validate import (
    TraceError,
    check_sequences,
    check_steps,
    header_and_sequences_from_dict,
    header_from_dict,
)

PARQUET_MAGIC = b"PAR1"
CONTAINER = "parquet"
# 1: sequences as JSON in the footer (still read); 2: sequences as an Arrow table beside it.
CONTAINER_VERSION = 2
READABLE_CONTAINER_VERSIONS = (1, 2)
METADATA_KEY = b"specviz"
SEQUENCES_KEY = b"specviz.sequences"
# A crafted footer must not inflate to gigabytes: the sequences' stream may be at most
# max(MIN_SEQUENCES_BOUND, MAX_SEQUENCES_RATIO x its compressed size). Real ones compress 2-20x
# (token ids, margins; 13x for a synthetic run's constant margins), and a degenerate run (one
# token repeated) stays under the floor unless it is hundreds of MB of sequences.
MAX_SEQUENCES_RATIO = 2_000
MIN_SEQUENCES_BOUND = 256 << 20
# Row-steps per row group: about 1-4 MB of columns, a few steps of a batch-256 run. A row group
# holds whole steps, so one can be larger by at most one step.
ROW_GROUP_ROWS = 16_384

STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepRecord) if f.name != "rows")
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(RowRecord))
# A step field and a row field never share a name (`row` vs `rows`), so one flat table holds both.
assert not set(STEP_FIELDS) & set(ROW_FIELDS)


class ColumnarError(ValueError):
    """A Parquet file that cannot be read as a trace (one line, names the problem)."""


# ----------------------------------------------------------------------------- the table schema


def _table_schema() -> pa.Schema:
    fields = []
    for cls, names in ((StepRecord, STEP_FIELDS), (RowRecord, ROW_FIELDS)):
        hints = typing.get_type_hints(cls)
        for name in names:
            arrow, nullable = arrow_type(hints[name])
            fields.append(pa.field(name, arrow, nullable=nullable))
    return pa.schema(fields)


TABLE_SCHEMA = _table_schema()


# ----------------------------------------------------------------------------- writing


def _footer(header: Header, sequences: list[SequenceRecord], group_steps: list[int]) -> dict[bytes, bytes]:
    ipc = sequences_ipc(sequences)
    body = {
        "format": FORMAT_NAME,
        "container": CONTAINER,
        "container_version": CONTAINER_VERSION,
        "header": header,
        "row_group_steps": group_steps,  # steps in each row group, so step i is found without a scan
        "sequences_bytes": len(ipc),  # the Arrow stream's size, so inflating it allocates that and no more
    }
    text = json.dumps(body, separators=(",", ":"), allow_nan=False, default=json_fields).encode()
    # Footer metadata is not compressed by Parquet, and the sequences' token lists are a third of
    # a run's bytes: compress both (a value is binary in Parquet's key-value metadata).
    return {
        METADATA_KEY: gzip.compress(text, compresslevel=6, mtime=0),
        SEQUENCES_KEY: pa.compress(ipc, codec="zstd", asbytes=True),
    }


class ParquetTraceWriter:
    """Writes a trace's steps as they finish, in row groups, so no run is ever whole in memory.

    `add_step` buffers one step's rows and flushes a row group once `row_group_rows` row-steps
    are buffered; `close` flushes the rest, writes the header and sequences into the footer and
    renames the file into place (atomic: a reader never sees a half-written file at `path`).
    """

    def __init__(self, path: str | os.PathLike[str], row_group_rows: int = ROW_GROUP_ROWS) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self._tmp = Path(tmp)
        self._writer = pq.ParquetWriter(str(self._tmp), TABLE_SCHEMA, compression="zstd")
        self._columns: dict[str, list[Any]] = {name: [] for name in TABLE_SCHEMA.names}
        self._buffered = 0
        self._buffered_steps = 0
        self.group_steps: list[int] = []
        self.row_group_rows = row_group_rows
        self.steps_written = 0
        self.empty_steps_dropped = 0

    def add_step(self, step: StepRecord) -> None:
        if not step.rows:  # a step with no rows has no table row to live in; it checks nothing
            self.empty_steps_dropped += 1
            return
        columns = self._columns
        for row in step.rows:
            for name in STEP_FIELDS:
                columns[name].append(getattr(step, name))
            for name in ROW_FIELDS:
                columns[name].append(getattr(row, name))
        self._buffered += len(step.rows)
        self._buffered_steps += 1
        self.steps_written += 1
        if self._buffered >= self.row_group_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered steps as one row group (nothing if none are buffered)."""
        if not self._buffered:
            self._buffered_steps = 0  # steps without rows hold no table rows; they are not stored
            return
        self._writer.write_table(pa.table(self._columns, schema=TABLE_SCHEMA), row_group_size=self._buffered)
        self._columns = {name: [] for name in TABLE_SCHEMA.names}
        self.group_steps.append(self._buffered_steps)
        self._buffered = self._buffered_steps = 0

    def close(
        self, header: Header, sequences: list[SequenceRecord], path: str | os.PathLike[str] | None = None
    ) -> Path:
        """Finish the file and rename it into place: at `path` if given (decided at the end of a
        run, say beside an existing trace), else where the writer was opened for."""
        if path is not None:
            self.path = Path(path)
        try:
            self.flush()
            self._writer.add_key_value_metadata(_footer(header, sequences, self.group_steps))
            self._writer.close()
            os.chmod(self._tmp, umask_file_mode())  # mkstemp makes 0600; a trace is a normal file
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Drop the file being written (an error before `close`)."""
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - already failing; the temp file goes either way
            pass
        self._tmp.unlink(missing_ok=True)


def save_parquet(trace: Trace, path: str | os.PathLike[str]) -> Path:
    writer = ParquetTraceWriter(path)
    for step in trace.steps:
        writer.add_step(step)
    return writer.close(trace.header, trace.sequences)


# ----------------------------------------------------------------------------- reading


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
        _check_columns(self._file.schema_arrow, self.path)
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
        return _steps_of_table(self._read_table(group), self.path, group)

    def _read_table(self, group: int) -> pa.Table:
        try:
            return _with_optional_columns(self._file.read_row_group(group, use_threads=False))
        except (OSError, pa.ArrowException) as exc:
            reason = _quoted(exc, self.path)
            raise ColumnarError(f"{self.path.name}: row group {group}: unreadable ({reason})") from None

    def read_group(self, group: int) -> list[StepRecord]:
        """One row group's steps, checked like a JSON trace's (the previous group's last step
        number comes from its statistics, so groups can be read in any order)."""
        if self._cache is not None and self._cache[0] == group:
            return self._cache[1]
        table = self._read_table(group)
        steps = _steps_of_table(table, self.path, group)
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
        return _steps_of_table(rows, self.path, group)[0]

    def read_table(self, group: int) -> pa.Table:
        """One row group as Arrow columns, validated as `read_group` validates its steps (a group
        the column checks doubt is decoded and checked row by row, which names the bad field)."""
        table = self._read_table(group)
        nulls = any(table.column(name).null_count for name in _REQUIRED_ROW)
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


# Columns added by schema versions 3 and 4: a file written before them lacks them, read as nulls.
OPTIONAL_COLUMNS = frozenset(TREE_ROW_FIELDS + V4_ROW_FIELDS)


def _with_optional_columns(table: pa.Table) -> pa.Table:
    """`table` with every optional column it lacks appended as nulls (an older file)."""
    for name in sorted(OPTIONAL_COLUMNS - set(table.column_names)):
        table = table.append_column(TABLE_SCHEMA.field(name), pa.nulls(len(table), TABLE_SCHEMA.field(name).type))
    return table


def _check_columns(schema: pa.Schema, path: Path) -> None:
    names = set(schema.names)
    for field in TABLE_SCHEMA:
        if field.name not in names and field.name in OPTIONAL_COLUMNS:
            continue
        if field.name not in names:
            raise ColumnarError(f"{path}: column {field.name!r} missing")
        actual = schema.field(field.name).type
        if actual != field.type:
            raise ColumnarError(f"{path}: column {field.name!r}: expected {field.type}, got {actual}")
    extra = names - set(TABLE_SCHEMA.names)
    if extra:
        raise ColumnarError(f"{path}: unknown column {sorted(extra)[0]!r}")


_REQUIRED_ROW = [f.name for f in TABLE_SCHEMA if not f.nullable]


def _steps_of_table(table: pa.Table, path: Path, group: int) -> list[StepRecord]:
    try:
        return _steps_of({name: pylist(table.column(name)) for name in table.column_names})
    except ColumnarError as exc:
        raise ColumnarError(f"{path}: row group {group}: {exc}") from None


def _steps_of(columns: dict[str, list[Any]]) -> list[StepRecord]:
    """Group consecutive row-steps of one step number back into StepRecords."""
    n = len(columns["step"])
    for name in _REQUIRED_ROW:  # a null in a non-nullable column (a crafted file) is refused here
        if None in columns[name]:
            raise ColumnarError(f"column {name!r}: null value")
    rows = list(map(RowRecord, *(columns[name] for name in ROW_FIELDS)))
    numbers = columns["step"]
    # Each step's rows are consecutive: its first row-step starts where the step number changes.
    starts = [i for i in range(n) if i == 0 or numbers[i] != numbers[i - 1]]
    step_cols = [columns[name] for name in STEP_FIELDS]
    return [StepRecord(*(col[a] for col in step_cols), rows=rows[a:b]) for a, b in zip(starts, starts[1:] + [n])]


def is_parquet(path: str | os.PathLike[str]) -> bool:
    """By content, not by name: a regular file whose first four bytes are `PAR1`.

    Opened non-blocking and checked with fstat first, so a FIFO or a device never blocks us (the
    JSON reader then refuses it with its own message)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.read(fd, 4) == PARQUET_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)
