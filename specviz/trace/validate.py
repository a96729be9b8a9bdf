"""Field-by-field validation of a trace's values, shared by both containers.

Every value is checked against the dataclass field types before a dataclass exists, and the
cross-field checks the forensics need to run (ids that exist, steps in order, counts in range)
run after. Any problem raises `TraceError` with a one-line message naming the field (e.g.
`steps[3].rows[1].accepted: expected int, got str`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from specviz.trace.schema import (
    FORMAT_NAME,
    LAYOUTS,
    OLDEST_READABLE_VERSION,
    SCHEMA_VERSION,
    Header,
    ModelInfo,
    RowRecord,
    SequenceRecord,
    StepRecord,
    Trace,
)

MAX_LENGTH = 10_000_000  # bound on any length/count field (slots, tokens, steps)
MAX_ABS_INT = MAX_LENGTH * 1000  # token ids can exceed lengths; past this an int is just absurd


class TraceError(ValueError):
    """A file that cannot be read as a trace. The message is one line and names the problem."""


def check_format(data: Any) -> None:
    if not isinstance(data, dict):
        raise TraceError(f"top level: expected a JSON object, got {_kind(data)}")
    if data.get("format") != FORMAT_NAME:
        raise TraceError(f"format: expected {FORMAT_NAME!r}, got {data.get('format')!r}")
    header = data.get("header")
    version = header.get("schema_version") if isinstance(header, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceError("header.schema_version: missing or not an integer")
    if version > SCHEMA_VERSION:
        raise TraceError(
            f"header.schema_version: trace is version {version}, this specviz reads up to "
            f"{SCHEMA_VERSION}; upgrade specviz"
        )
    if version < OLDEST_READABLE_VERSION:
        raise TraceError(
            f"header.schema_version: trace is version {version}, which this specviz no longer "
            f"reads (current {SCHEMA_VERSION}); re-record it"
        )


def build_trace(body: dict[str, Any]) -> Trace:
    """The Trace of a parsed body (the top-level object less `format`), every field checked."""
    trace = _CONVERTERS[Trace](body, "")
    _check_references(trace)
    return trace


def header_from_dict(data: Any) -> Header:
    """The header of a trace whose steps and sequences are stored elsewhere (the Parquet footer)."""
    check_format(data)
    header = _CONVERTERS[Header](data.get("header"), "header")
    _check_header(header)
    return header


def header_and_sequences_from_dict(data: Any) -> tuple[Header, list[SequenceRecord]]:
    """The header and JSON sequences of a trace whose steps are stored elsewhere (Parquet container 1)."""
    header = header_from_dict(data)
    sequences = _build(list[SequenceRecord])(data.get("sequences"), "sequences")
    check_sequences(sequences)
    return header, sequences


# ----------------------------------------------------------------------------- validation

Converter = Callable[[Any, str], Any]
_CONVERTERS: dict[Any, Converter] = {}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _fail(path: str, message: str) -> typing.NoReturn:
    raise TraceError(f"{path or 'top level'}: {message}")


def _int(value: Any, path: str) -> int:
    if type(value) is not int:
        _fail(path, f"expected int, got {_kind(value)}")
    if abs(value) > MAX_ABS_INT:
        _fail(path, f"absurd value {value}")
    return value


def _float(value: Any, path: str) -> float:
    if type(value) not in (int, float):
        _fail(path, f"expected number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        _fail(path, f"number out of range ({len(str(abs(value)))} digits)")
    if not math.isfinite(number):
        _fail(path, "number is not finite")
    return number


def _int_list(value: Any, path: str) -> list[int]:
    """Token lists dominate a trace: check them in bulk, per item only to name a bad one."""
    if type(value) is not list:
        _fail(path, f"expected array, got {_kind(value)}")
    if value and (set(map(type, value)) != {int} or max(value) > MAX_ABS_INT or min(value) < -MAX_ABS_INT):
        for i, v in enumerate(value):
            _int(v, f"{path}[{i}]")
    return value


def _float_list(value: Any, path: str) -> list[float]:
    """Margins lists are long too: all floats and all finite is checked in bulk (ints are converted)."""
    if type(value) is not list:
        _fail(path, f"expected array, got {_kind(value)}")
    if set(map(type, value)) <= {float} and all(map(math.isfinite, value)):
        return value
    return [_float(v, f"{path}[{i}]") for i, v in enumerate(value)]


def _simple(tp: type) -> Converter:
    def convert(value: Any, path: str) -> Any:
        if type(value) is not tp:
            _fail(path, f"expected {tp.__name__}, got {_kind(value)}")
        return value

    return convert


def _any(value: Any, path: str) -> Any:
    return value


def _build(tp: Any) -> Converter:
    if tp in _CONVERTERS:
        return _CONVERTERS[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        conv = _any
    elif tp is int:
        conv = _int
    elif tp is float:
        conv = _float
    elif tp in (str, bool):
        conv = _simple(tp)
    elif origin in (typing.Union, types.UnionType):
        inner_types = [a for a in args if a is not type(None)]
        if len(inner_types) != 1:
            raise TypeError(f"unsupported union {tp}")
        inner = _build(inner_types[0])

        def conv(value: Any, path: str, inner: Converter = inner) -> Any:
            return None if value is None else inner(value, path)

    elif origin is list and args[0] is int:
        conv = _int_list
    elif origin is list and args[0] is float:
        conv = _float_list
    elif origin is list:
        item = _build(args[0])

        def conv(value: Any, path: str, item: Converter = item) -> Any:
            if type(value) is not list:
                _fail(path, f"expected array, got {_kind(value)}")
            return [item(v, f"{path}[{i}]") for i, v in enumerate(value)]

    elif origin is dict:
        item = _build(args[1])

        def conv(value: Any, path: str, item: Converter = item) -> Any:
            if type(value) is not dict:
                _fail(path, f"expected object, got {_kind(value)}")
            return {k: item(v, f"{path}.{k}") for k, v in value.items()}

    elif dataclasses.is_dataclass(tp):
        conv = _dataclass_converter(tp)
    else:
        raise TypeError(f"unsupported field type {tp}")
    _CONVERTERS[tp] = conv
    return conv


def _dataclass_converter(cls: type) -> Converter:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    known = {f.name for f in fields}
    converters: dict[str, Converter] = {}

    def conv(value: Any, path: str) -> Any:
        if type(value) is not dict:
            _fail(path, f"expected object, got {_kind(value)}")
        missing = required - value.keys()
        if missing:
            _fail(path, f"missing field {sorted(missing)[0]!r}")
        extra = value.keys() - known
        if extra:
            _fail(path, f"unknown field {sorted(extra)[0]!r}")
        prefix = f"{path}." if path else ""
        # A row is ~20 fields, most a plain int, bool or string: one taken as is when it already
        # is what the converter would return (12,000 rows at the public budget: ~240,000 converter
        # calls and path strings fewer); any other value, and every bad one, goes to its converter.
        kwargs = {}
        for k, v in value.items():
            kind = type(v)
            if kind in plain.get(k, ()) and (kind is not int or -MAX_ABS_INT <= v <= MAX_ABS_INT):
                kwargs[k] = v
            else:
                kwargs[k] = converters[k](v, prefix + k)
        return cls(**kwargs)

    _CONVERTERS[cls] = conv  # register before recursing (no cycles today, but cheap safety)
    for name, hint in hints.items():
        converters[name] = _build(hint)
    plain = {name: kinds for name, hint in hints.items() if (kinds := _plain_kinds(hint))}
    return conv


def _plain_kinds(hint: Any) -> tuple[type, ...]:
    """The value types `_build(hint)` returns unchanged after a type check alone (an int also within
    MAX_ABS_INT): int, bool, str and their optional forms. Floats are converted, lists walked."""
    plain = (int, bool, str)
    if hint in plain:
        return (hint,)
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return (inner, type(None)) if inner in plain else ()
    return ()


for _cls in (ModelInfo, Header, RowRecord, StepRecord, SequenceRecord, Trace):
    _build(_cls)


FINISH_REASONS = (None, "eos", "length")


def _nonneg(value: int | None, path: str) -> None:
    if value is not None and not 0 <= value <= MAX_LENGTH:
        _fail(path, f"must be between 0 and {MAX_LENGTH}, got {value}")


def _check_references(trace: Trace) -> None:
    """Structural sanity the checks need to even run; engine mistakes are left to forensics."""
    _check_header(trace.header)
    check_steps(trace.steps, check_sequences(trace.sequences), -1)


def _check_header(h: Header) -> None:
    if h.method not in ("baseline", "eqspec", "exspec") and not h.method:
        _fail("header.method", "empty")
    if h.layout not in LAYOUTS:
        _fail("header.layout", f"expected one of {', '.join(LAYOUTS)}, got {h.layout!r}")
    _nonneg(h.draft_k, "header.draft_k")
    _nonneg(h.max_new_tokens, "header.max_new_tokens")
    if not 1 <= h.batch_size <= MAX_LENGTH:
        _fail("header.batch_size", f"must be at least 1, got {h.batch_size}")


def check_sequences(sequences: list[SequenceRecord]) -> set[int]:
    """The sequence ids, after checking each sequence; a duplicate id is refused."""
    seq_ids: set[int] = set()
    for i, seq in enumerate(sequences):
        path = f"sequences[{i}]"
        if seq.seq_id in seq_ids:
            _fail(f"{path}.seq_id", f"duplicate sequence id {seq.seq_id}")
        seq_ids.add(seq.seq_id)
        if not seq.prompt_ids:
            _fail(f"{path}.prompt_ids", "empty prompt")
        if seq.reference_margins is not None and seq.reference_ids is not None:
            if len(seq.reference_margins) != len(seq.reference_ids):
                _fail(f"{path}.reference_margins", "length differs from reference_ids")
        if seq.reference_margins is not None and seq.reference_ids is None:
            # Margins are indexed by reference token; without the tokens they mean nothing.
            _fail(f"{path}.reference_margins", "present but reference_ids is null")
        if seq.finish_reason not in FINISH_REASONS:
            _fail(f"{path}.finish_reason", f"unknown reason {_short(seq.finish_reason)}")
    return seq_ids


ROW_COUNTS = (  # the row fields that count slots or tokens: 0 .. MAX_LENGTH
    "committed_before",
    "left_pad",
    "left_pad_after",
    "kv_len",
    "kv_len_expected",
    "draft_kv_len",
    "draft_kv_len_expected",
    "accepted",
    "kv_mismatch_slot",
)
_STEP_TIMES = ("draft_ms", "verify_ms", "align_ms", "total_ms")


def check_steps(steps: list[StepRecord], seq_ids: set[int], previous_step: int, first_index: int = 0) -> int:
    """Check a run of consecutive steps (all of a trace, or one Parquet row group); returns the
    last step number, to pass as `previous_step` for the next run. `first_index` numbers paths."""
    for s, step in enumerate(steps, first_index):
        path = f"steps[{s}]"
        _nonneg(step.cache_len, f"{path}.cache_len")
        _nonneg(step.query_len, f"{path}.query_len")
        _nonneg(step.step, f"{path}.step")
        for name in _STEP_TIMES:  # JSON refuses NaN at parse time; a columnar file may hold one
            if not math.isfinite(getattr(step, name)):
                _fail(f"{path}.{name}", "number is not finite")
        # Execution order is what "first violation" means. Gaps are allowed: some engines number
        # scheduler iterations, including prefill-only ones that are not verify steps.
        if step.step <= previous_step:
            _fail(f"{path}.step", f"step numbers must increase, got {step.step} after {previous_step}")
        previous_step = step.step
        for r, row in enumerate(step.rows):
            _check_row(row, path, r, seq_ids)
    return previous_step


def _check_row(row: RowRecord, step_path: str, r: int, seq_ids: set[int]) -> None:
    """One row's references and ranges; its path (`steps[s].rows[r]`) is only spelled for a message."""
    if row.seq_id not in seq_ids:
        _fail(f"{step_path}.rows[{r}].seq_id", f"no sequence with id {row.seq_id}")
    if row.write_seq not in seq_ids:
        _fail(f"{step_path}.rows[{r}].write_seq", f"no sequence with id {row.write_seq}")
    for name in ROW_COUNTS:
        value = getattr(row, name)
        if value is not None and not 0 <= value <= MAX_LENGTH:
            _nonneg(value, f"{step_path}.rows[{r}].{name}")
    rpath = f"{step_path}.rows[{r}]"
    for j, count in enumerate(row.draft_kv_lens or ()):
        _nonneg(count, f"{rpath}.draft_kv_lens[{j}]")
    for j, run in enumerate(row.mask_rle):
        if len(run) != 2 or run[0] not in (0, 1) or not 0 <= run[1] <= MAX_LENGTH:
            _fail(f"{rpath}.mask_rle[{j}]", "expected [0 or 1, count >= 0]")
    if row.finish_reason not in FINISH_REASONS:
        _fail(f"{rpath}.finish_reason", f"unknown reason {_short(row.finish_reason)}")


def _short(value: object, limit: int = 40) -> str:
    """A value as a message quotes it: its repr, cut (a crafted file's string may be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
