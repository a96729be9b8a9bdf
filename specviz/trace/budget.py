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
    # The piece table (`header.token_text`): at most one entry per token ID the trace uses and
    # below the vocabulary it declares; every string and every header item is counted too.
    max_token_text_entries: int = 1 << 18  # 262,144: Gemma's vocabulary
    max_token_text_chars: int = 1 << 23  # keys and texts of the piece table together
    max_text_chars: int = 1 << 24  # every other string: prompts, recorded output text, header strings
    max_header_items: int = 100_000  # values in the header outside the piece table (options, events...)

    @property
    def max_mask_length(self) -> int:
        """Slots one expanded mask row may cover: wider than any step may declare is absurd."""
        return self.max_cache_len + self.max_query_len


DEFAULT_BUDGET = Budget()

# A public Space's uploads: what a 2-core machine loads in at most 3 s of CPU and 300 MB kept, the
# upload event's first render included (`tools/attack_suite.py --only sessions` measures each
# upload's server CPU). Bundled traces and local files are the user's own. Rows (row-steps) set the
# CPU: at 12,000 the heaviest accepted upload's event took 1.3-2.9 s of server CPU (median 1.6-2.0:
# parse ~0.8, check ~0.5, first render ~0.3) and kept at most 41 MB, on 1 December 2026 (2 cores
# shared, load 5-7); 20,000 rows took 3.8-4.5 s before the views stopped re-walking the steps.
PUBLIC_BUDGET = Budget(
    max_steps=12_000,
    max_rows=12_000,
    max_mask_runs=500_000,
    max_sequences=4_000,
    max_sequence_tokens=1 << 16,
    max_cells=2_000_000,
    max_positions=200_000,
    max_token_text_chars=1 << 22,
    max_text_chars=1 << 22,
    max_header_items=20_000,
)

# Per-row lists, schema version 2 optional ones included (an absent or null one counts 0).
ROW_TOKEN_FIELDS = (
    "draft_tokens",
    "target_tokens",
    "emitted",
    "position_ids",
    "draft_position_ids",
    "draft_kv_lens",
    # schema version 3: the tree and head-input fields
    "tree_parents",
    "tree_depths",
    "tree_path",
    "kept_nodes",
    "head_source",
    # schema version 4
    "draft_input_tokens",
    "penalty_added",
    "draft_prefill_tokens",
)
ROW_NESTED_FIELDS = ("node_attends", "prefill_chunks")  # schema 3: a list per tree node, counted by all its items
SEQUENCE_TOKEN_FIELDS = ("prompt_ids", "output_ids", "reference_ids", "reference_margins")
ROW_ID_FIELDS = ("draft_tokens", "target_tokens", "emitted")  # token IDs a reader may show
SEQUENCE_ID_FIELDS = ("prompt_ids", "output_ids", "reference_ids")
SEQUENCE_TEXT_FIELDS = ("prompt", "output_text", "finish_reason")
PIECE_TABLE = "token_text"


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
        self.chars = 0
        self.pieces: dict[str, Any] | None = None  # the piece table, checked once the used IDs are known
        self.used: set[Any] | None = None  # token IDs the trace uses (collected only with a piece table)

    def over(self, path: str, what: str, value: int, limit: int) -> None:
        if value > limit:
            raise _Over(f"{path}: {what} {value} is over the budget of {limit}")

    def add_cells(self, path: str, count: int) -> None:
        self.cells += count
        self.over(path, "list items in the trace so far", self.cells, self.budget.max_cells)

    def add_chars(self, path: str, count: int) -> None:
        self.chars += count
        self.over(path, "characters of text in the trace so far", self.chars, self.budget.max_text_chars)

    def header(self, header: Any) -> None:
        if isinstance(header, dict):
            # draft_k sizes per-sequence histograms; batch_size the rows of a step.
            self.over("header.draft_k", "draft_k", _int_field(header, "draft_k"), self.budget.max_query_len - 1)
            self.over(
                "header.batch_size", "batch_size", _int_field(header, "batch_size"), self.budget.max_rows_per_step
            )
            tables = [("header.token_text", header.get(PIECE_TABLE))]
            options = header.get("options")
            if isinstance(options, dict):  # the older place of the piece table
                tables.append(("header.options.token_text", options.get(PIECE_TABLE)))
            rest = {k: v for k, v in header.items() if k not in (PIECE_TABLE, "options")}
            if isinstance(options, dict):
                rest["options"] = {k: v for k, v in options.items() if k != PIECE_TABLE}
            else:
                rest["options"] = options
            self.header_items(rest)
            for path, table in tables:
                if isinstance(table, dict) and table:
                    self.piece_table(path, table, header)

    def header_items(self, header: dict[str, Any]) -> None:
        """Every value of the header (options, fault events, versions) and its characters, bounded."""
        limit, items, chars = self.budget.max_header_items, 0, 0
        stack: list[Any] = [header]
        while stack:
            value = stack.pop()
            items += 1
            if items > limit:
                self.over("header", "values in the header", items, limit)
            if isinstance(value, str):
                chars += len(value)
            elif isinstance(value, dict):
                chars += sum(len(k) for k in value)
                stack.extend(value.values())
            elif isinstance(value, list):
                stack.extend(value)
        self.add_chars("header", chars)

    def piece_table(self, path: str, table: dict[str, Any], header: dict[str, Any]) -> None:
        """Entries bounded by the budget and by the vocabulary the trace declares; the IDs it uses later."""
        b = self.budget
        self.over(path, "piece table entries", len(table), b.max_token_text_entries)
        target = header.get("target")
        vocab = _int_field(target, "vocab_size") if isinstance(target, dict) else 0
        if vocab > 0:
            self.over(path, "piece table entries (the vocabulary is smaller)", len(table), vocab)
        chars = 0
        for key, text in table.items():
            chars += len(key) + (len(text) if isinstance(text, str) else 0)
        self.over(path, "characters in the piece table", chars, b.max_token_text_chars)
        if vocab > 0:
            for key in table:
                if key.isdecimal() and len(key) < 12 and int(key) >= vocab:
                    raise _Over(f"{path}: token ID {key[:12]} is not below the vocabulary size {vocab}")
        self.pieces = {**(self.pieces or {}), **table}
        self.used = set()

    def check_pieces(self) -> None:
        """A piece table may name only token IDs the trace uses: no text is kept for nothing."""
        if not self.pieces or self.used is None:
            return
        used = {str(token) for token in self.used if type(token) is int}
        self.over("header.token_text", "piece table entries (IDs the trace uses)", len(self.pieces), len(used))
        for key in self.pieces:
            if key not in used:
                raise _Over(f"header.token_text: token ID {key[:12]!r} is not used anywhere in the trace")

    def use(self, value: Any) -> None:
        if self.used is None:
            return
        if isinstance(value, list):
            self.used.update(v for v in value if type(v) is int)
        elif type(value) is int:
            self.used.add(value)

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
        for name in ROW_NESTED_FIELDS:
            value = row.get(name)
            count = _length(value) + sum(map(_length, value)) if isinstance(value, list) else 0
            # Node i attends depth(i) + 1 nodes: a chain of q nodes holds about q * q / 2 of them.
            self.over(f"{path}.{name}", "length", count, b.max_row_tokens * b.max_query_len)
            self.add_cells(f"{path}.{name}", count)
        if self.used is not None:
            for name in ROW_ID_FIELDS:
                self.use(row.get(name))
            self.use(row.get("pending_token"))
            self.use(row.get("bonus"))
        reason = row.get("finish_reason")
        if isinstance(reason, str):
            self.add_chars(f"{path}.finish_reason", len(reason))
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
            if self.used is not None:
                for name in SEQUENCE_ID_FIELDS:
                    self.use(seq.get(name))
            for name in SEQUENCE_TEXT_FIELDS:
                value = seq.get(name)
                if isinstance(value, str):
                    self.add_chars(f"sequences[{i}].{name}", len(value))


def budget_items(budget: Budget | None) -> int | None:
    """The most items any one container of a trace within `budget` holds (steps, sequences, the
    piece table, the header's values): the parser refuses a container past it before building the
    rest (`jsonparse.TooMany`); `over_budget` then says which limit a smaller excess breaks."""
    if budget is None:
        return None
    return max(budget.max_steps, budget.max_sequences, budget.max_token_text_entries, budget.max_header_items)


def over_budget(data: Any, budget: Budget = DEFAULT_BUDGET) -> str | None:
    """The first way parsed trace JSON exceeds `budget`, as one line; None when within it."""
    if not isinstance(data, dict):
        return None
    walk = _Walk(budget)
    try:
        walk.header(data.get("header"))
        walk.steps(data.get("steps"))
        walk.sequences(data.get("sequences"))
        walk.check_pieces()
    except _Over as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------------- local files


@dataclass(frozen=True)
class FileLimits:
    """What a local trace file may make of itself once read, from its own declared sizes (issue 34).

    `specviz check` is a CI gate that reads artifacts other jobs wrote: a 75 KB Parquet file may
    declare one 1 MB dictionary string for 20,000 rows (20 GB read), a footer may inflate to 20M
    empty JSON objects (1.5 GB parsed), a 3 MB gzip to 400 MB of JSON (2.5 GB). Each is refused in
    one line before it is built. The largest run the project records (480 x 128 tokens) is 12 MB
    of JSON and row groups of 1-4 MB: far inside. `--no-limits` lifts them for a trusted big run
    (the free-memory check still applies).
    """

    decode_floor: int = 64 << 20  # any file's part (a row group, the footer) may decode to this...
    decode_ratio: int = 20  # ...or to this many times the file's own size, if more
    json_bytes: int = 64 << 20  # JSON text of a local trace, after gzip (parsed: ~12x, at most ~23x)
    parse_bytes: int = 1 << 30  # Python objects a JSON text may parse into (`json_parse_bytes`)

    def decoded_bound(self, file_bytes: int) -> int:
        return max(self.decode_floor, self.decode_ratio * file_bytes)


FILE_LIMITS = FileLimits()
NO_LIMITS_HINT = "pass --no-limits for a trusted big run"
_limits: list[FileLimits | None] = [FILE_LIMITS]  # the process's setting (`--no-limits`: None)


def file_limits() -> FileLimits | None:
    """The limits local reads apply now; None after `set_file_limits(None)` (`--no-limits`)."""
    return _limits[0]


def set_file_limits(limits: FileLimits | None) -> None:
    _limits[0] = limits


def json_parse_bytes(text: str) -> int:
    """At most what `json.loads(text)` allocates, from the punctuation alone (a C-speed count, no
    parse): every object or array ~64 bytes, every further item ~40 (a pointer and an int)."""
    return len(text) + 64 * (text.count("{") + text.count("[")) + 40 * text.count(",")
