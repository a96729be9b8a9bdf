"""The semantic budget of a trace: how much a file may declare before anything is built from it.

The loader already bounds bytes (file size, gzip inflation) and single values (`MAX_LENGTH`). That
is not enough: a 3 KB file may declare a million cache slots, a row may carry 200 mask runs of ten
million slots each, and a few MB of gzip may hold a million steps. Views and checks draw a window
of such a trace, but everything they touch per row, per step or per sequence must also be bounded,
so the loader refuses a trace that declares more than this budget, with a one-line message naming
the first field over it.

`over_budget` walks the parsed JSON (plain dicts and lists) before any dataclass is built, so a
refused file costs only its parse. It is defensive about types: a wrong type is not its business
(the field-by-field conversion reports it with a better message), it only counts what it can.

The defaults hold 5-20x the largest run the project records (480 prompts x 128 new tokens at batch
16: 1,903 steps, 26,886 rows, 12 MB of JSON) and long-context traces of one million cache slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Budget:
    max_steps: int = 200_000
    max_rows_per_step: int = 1024  # rows of one step: the batch (the grid draws every row)
    max_rows: int = 600_000  # rows summed over all steps
    max_cache_len: int = 1 << 20  # slots of one step's cache (a 1M-token context)
    max_query_len: int = 257  # k + 1 with k up to 256 drafts (per-sequence histograms are k + 1 long)
    max_row_tokens: int = 257  # drafts, targets, emitted and positions of one row
    max_step_query_cells: int = 1 << 16  # rows x query_len of one step (32 rows x 9 is typical)
    max_mask_runs_per_row: int = 4096
    max_mask_runs: int = 4_000_000  # runs summed over all rows
    max_sequences: int = 20_000
    max_sequence_tokens: int = 1 << 20  # prompt, output or reference of one sequence
    max_cells: int = 8_000_000  # every stored list item: tokens, positions, margins, mask runs
    # Fed positions index the grid's history (one entry each, ~240 bytes): 134k in a 480 x 128 run.
    max_positions: int = 1_000_000

    @property
    def max_mask_length(self) -> int:
        """Slots one expanded mask row may cover: wider than any step may declare is absurd."""
        return self.max_cache_len + self.max_query_len


DEFAULT_BUDGET = Budget()

# Per-row lists, schema version 2 optional ones included (an absent or null one counts 0).
ROW_TOKEN_FIELDS = ("draft_tokens", "target_tokens", "emitted", "position_ids", "draft_position_ids", "draft_kv_lens")
SEQUENCE_TOKEN_FIELDS = ("prompt_ids", "output_ids", "reference_ids", "reference_margins")


class _Over(Exception):
    """Internal: carries the one-line message out of the walk."""


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (list, dict, str)) else 0


def _int_field(obj: dict[str, Any], name: str) -> int:
    value = obj.get(name)
    return value if type(value) is int else 0


class _Walk:
    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.rows = 0
        self.runs = 0
        self.cells = 0
        self.positions = 0

    def over(self, path: str, what: str, value: int, limit: int) -> None:
        if value > limit:
            raise _Over(f"{path}: {what} {value} is over the budget of {limit}")

    def add_cells(self, path: str, count: int) -> None:
        self.cells += count
        self.over(path, "list items in the trace so far", self.cells, self.budget.max_cells)

    def header(self, header: Any) -> None:
        if isinstance(header, dict):
            # draft_k sizes per-sequence histograms; batch_size the rows of a step.
            self.over("header.draft_k", "draft_k", _int_field(header, "draft_k"), self.budget.max_query_len - 1)
            self.over(
                "header.batch_size", "batch_size", _int_field(header, "batch_size"), self.budget.max_rows_per_step
            )

    def steps(self, steps: Any) -> None:
        if not isinstance(steps, list):
            return
        self.over("steps", "step count", len(steps), self.budget.max_steps)
        for s, step in enumerate(steps):
            if isinstance(step, dict):
                self.step(step, f"steps[{s}]")

    def step(self, step: dict[str, Any], path: str) -> None:
        b = self.budget
        self.over(f"{path}.cache_len", "cache_len", _int_field(step, "cache_len"), b.max_cache_len)
        self.over(f"{path}.query_len", "query_len", _int_field(step, "query_len"), b.max_query_len)
        rows = step.get("rows")
        if not isinstance(rows, list):
            return
        self.over(f"{path}.rows", "row count", len(rows), b.max_rows_per_step)
        # Every row draws every query slot: rows x query_len is what one step's grid must show.
        query_cells = len(rows) * _int_field(step, "query_len")
        self.over(f"{path}", "rows x query_len", query_cells, b.max_step_query_cells)
        self.rows += len(rows)
        self.over(f"{path}.rows", "rows summed over steps reach", self.rows, b.max_rows)
        for r, row in enumerate(rows):
            if isinstance(row, dict):
                self.row(row, f"{path}.rows[{r}]")

    def row(self, row: dict[str, Any], path: str) -> None:
        b = self.budget
        for name in ROW_TOKEN_FIELDS:
            count = _length(row.get(name))
            self.over(f"{path}.{name}", "length", count, b.max_row_tokens)
            self.add_cells(f"{path}.{name}", count)
        self.positions += _length(row.get("position_ids"))
        self.over(f"{path}.position_ids", "position IDs in the trace so far", self.positions, b.max_positions)
        runs = row.get("mask_rle")
        if not isinstance(runs, list):
            return
        self.over(f"{path}.mask_rle", "run count", len(runs), b.max_mask_runs_per_row)
        self.runs += len(runs)
        self.over(f"{path}.mask_rle", "mask runs summed over rows reach", self.runs, b.max_mask_runs)
        self.add_cells(f"{path}.mask_rle", len(runs))
        # Sum the counts without expanding anything: this is what a view would have to draw.
        expanded = sum(run[1] for run in runs if isinstance(run, list) and len(run) == 2 and type(run[1]) is int)
        self.over(f"{path}.mask_rle", "expanded mask length", expanded, b.max_mask_length)

    def sequences(self, sequences: Any) -> None:
        if not isinstance(sequences, list):
            return
        self.over("sequences", "sequence count", len(sequences), self.budget.max_sequences)
        for i, seq in enumerate(sequences):
            if not isinstance(seq, dict):
                continue
            for name in SEQUENCE_TOKEN_FIELDS:
                count = _length(seq.get(name))
                self.over(f"sequences[{i}].{name}", "length", count, self.budget.max_sequence_tokens)
                self.add_cells(f"sequences[{i}].{name}", count)


def over_budget(data: Any, budget: Budget = DEFAULT_BUDGET) -> str | None:
    """The first way parsed trace JSON exceeds `budget`, as one line; None when within it."""
    if not isinstance(data, dict):
        return None
    walk = _Walk(budget)
    try:
        walk.header(data.get("header"))
        walk.steps(data.get("steps"))
        walk.sequences(data.get("sequences"))
    except _Over as exc:
        return str(exc)
    return None
