"""A Parquet row group's columns as NumPy arrays: what the columnar check and the metrics read.

No checker state here (the checks are in `columnar`, the sums in `metrics`), so both import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from specviz.trace.arrow import list_parts, numbers, run_parts, string_lengths, valid
from specviz.trace.schema import ROW_WALK_FIELDS

# Row-steps checked at once: a whole row group as the writer cuts them (ROW_GROUP_ROWS, 16,384, plus
# at most one step). Each slice costs Python per sequence it holds (histories advanced, sums): slices
# of 4,096 cost about 1 s more CPU at 1.1M row-steps, for NumPy temporaries a few MB smaller.
SLICE_ROWS = 24_576


@dataclass
class Lists:
    """One list column of a row group, compacted: row r's items are values[start[r] : start[r] + lengths[r]]."""

    values: np.ndarray  # [items]
    lengths: np.ndarray  # [rows]
    start: np.ndarray  # [rows]
    row_of: np.ndarray  # [items] the row of each item
    index: np.ndarray  # [items] its index inside its row

    @classmethod
    def of(cls, offsets: np.ndarray, flat: np.ndarray, present: np.ndarray | None = None) -> Lists:
        lengths = np.diff(offsets)
        if present is not None:  # a null row holds no items
            lengths = np.where(present, lengths, 0)
        start = np.cumsum(lengths) - lengths
        row_of = np.repeat(np.arange(len(lengths)), lengths)
        index = np.arange(len(row_of)) - start[row_of]
        return cls(flat[offsets[:-1][row_of] + index], lengths, start, row_of, index)

    def at(self, rows: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Item j of each row (the caller keeps j inside the row; clipped to the array otherwise)."""
        if not len(self.values):
            return np.full(len(rows), -1, dtype=np.int64)
        return self.values[np.clip(self.start[rows] + j, 0, len(self.values) - 1)]

    def all(self, items_ok: np.ndarray) -> np.ndarray:
        """[rows]: every item of the row satisfies `items_ok` ([items])."""
        return np.bincount(self.row_of[~items_ok], minlength=len(self.lengths)) == 0


class Columns:
    """A row group's columns as NumPy arrays `[rows]` (lists as `Lists`); None from `of` when a
    column holds what these arrays do not take (a null inside a list), left to the row walk."""

    def __init__(self, table: pa.Table) -> None:
        col = table.column
        for name in ("step", "cache_len", "query_len", "seq_id", "write_seq", "committed_before", "left_pad"):
            setattr(self, name, numbers(col(name)))
        for name in ("pending_token", "accepted", "kv_len", "bonus", "draft_kv_len", "finished", "query_causal"):
            setattr(self, name, numbers(col(name)))
        self.kv_content_checked = numbers(col("kv_content_checked"))
        for name in (
            "bonus",
            "draft_kv_len",
            "kv_mismatch_slot",
            "query_causal",
            "draft_position_ids",
            "draft_kv_lens",
        ):
            setattr(self, f"{name}_valid", valid(col(name)))
        # schema 4: absent from older files (and then read as nulls)
        inputs = "draft_input_tokens" in table.column_names
        self.draft_input_tokens_valid = valid(col("draft_input_tokens")) if inputs else np.zeros(len(table), bool)
        self.reason = string_lengths(col("finish_reason"))
        self.n = len(self.step)

    @classmethod
    def of(cls, table: pa.Table) -> Columns | None:
        # Tree, head (schema 3) and penalty (4) fields have row checks only: such rows go row by row.
        if any(name in table.column_names and table.column(name).null_count < len(table) for name in ROW_WALK_FIELDS):
            return None
        columns = cls(table)
        names = ["draft_tokens", "target_tokens", "emitted", "position_ids", "draft_position_ids", "draft_kv_lens"]
        names += [name for name in ("draft_input_tokens",) if name in table.column_names]
        for name in names:
            parts = list_parts(table.column(name))
            if parts is None:
                return None
            present = getattr(columns, f"{name}_valid", None)
            setattr(columns, name, Lists.of(*parts, present))
        runs = run_parts(table.column("mask_rle"))
        if runs is None:
            return None
        offsets, kinds, counts = runs
        columns.run_kinds, columns.run_counts = Lists.of(offsets, kinds), Lists.of(offsets, counts)
        row_of, sizes = columns.run_counts.row_of, columns.run_counts.values
        columns.width = sums(row_of, sizes, columns.n)  # [rows] mask width
        columns.has_runs = np.bincount(row_of[sizes > 0], minlength=columns.n) > 0  # [rows] a run with slots
        return columns


def step_slices(table: pa.Table, rows: int = SLICE_ROWS) -> Iterator[tuple[int, pa.Table]]:
    """The row group in slices of whole steps, about `rows` row-steps each (zero-copy), as (steps
    before the slice, the slice): NumPy temporaries stay tens of MB whatever the group's size."""
    step_numbers = numbers(table.column("step"))
    starts = np.flatnonzero(np.concatenate([[True], step_numbers[1:] != step_numbers[:-1]]))
    begin = 0
    while begin < len(starts):
        end = max(begin + 1, int(np.searchsorted(starts, starts[begin] + rows, side="right")) - 1)
        if len(step_numbers) - starts[begin] <= rows:  # the rest fits: its last step too (its end is known)
            end = len(starts)
        stop = int(starts[end]) if end < len(starts) else len(step_numbers)
        yield begin, table.slice(int(starts[begin]), stop - int(starts[begin]))
        begin = end


def sums(row_of: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """[rows] sum of each row's items (exact: slot counts are far below 2**53)."""
    return np.bincount(row_of, weights=values, minlength=n).astype(np.int64)
