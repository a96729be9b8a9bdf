"""The columnar trace container: the same schema as the JSON trace, stored as Parquet.

JSON is the interchange format the docs teach and the public upload accepts; Parquet is what big
runs use. This module says what a file holds (the table's schema, both ways between the table and
the records) and writes one; `columnar_read.py` opens one. One file holds:
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

import dataclasses
import gzip
import json
import os
import stat
import tempfile
import typing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from specviz.files import umask_file_mode
from specviz.trace.arrow import arrow_type, pylist
from specviz.trace.schema import (
    FORMAT_NAME,
    TREE_ROW_FIELDS,
    Header,
    RowRecord,
    SequenceRecord,
    StepRecord,
    Trace,
    json_fields,
)
from specviz.trace.seqtable import sequences_ipc

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


# ----------------------------------------------------------------------------- the table, read back


# Columns added by schema version 3: a file written before them lacks them, read as nulls.
OPTIONAL_COLUMNS = frozenset(TREE_ROW_FIELDS)


def with_optional_columns(table: pa.Table) -> pa.Table:
    """`table` with every optional column it lacks appended as nulls (an older file)."""
    for name in sorted(OPTIONAL_COLUMNS - set(table.column_names)):
        table = table.append_column(TABLE_SCHEMA.field(name), pa.nulls(len(table), TABLE_SCHEMA.field(name).type))
    return table


def check_columns(schema: pa.Schema, path: Path) -> None:
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


REQUIRED_ROW_COLUMNS = [f.name for f in TABLE_SCHEMA if not f.nullable]


def steps_of_table(table: pa.Table, path: Path, group: int) -> list[StepRecord]:
    try:
        return steps_of_columns({name: pylist(table.column(name)) for name in table.column_names})
    except ColumnarError as exc:
        raise ColumnarError(f"{path}: row group {group}: {exc}") from None


def steps_of_columns(columns: dict[str, list[Any]]) -> list[StepRecord]:
    """Group consecutive row-steps of one step number back into StepRecords."""
    n = len(columns["step"])
    for name in REQUIRED_ROW_COLUMNS:  # a null in a non-nullable column (a crafted file) is refused here
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
