"""Save and load traces: JSON (gzip optional), atomic writes, strict validation on load.

Nothing in a trace is ever executed: the file is parsed with `json` and every value is checked
against the dataclass field types before a `Trace` exists. Any problem raises `TraceError` with a
one-line message naming the field (e.g. `steps[3].rows[1].accepted: expected int, got str`).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import os
import tempfile
import types
import typing
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specviz.files import FileRefused, read_regular_file, refuse_non_regular, umask_file_mode
from specviz.trace.budget import DEFAULT_BUDGET, Budget, over_budget
from specviz.trace.columnar import ColumnarError, ParquetTrace, ParquetTraceWriter, is_parquet, save_parquet
from specviz.trace.jsonparse import loads_yielding, top_level_kind
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

# Parsed JSON costs up to ~23x its text in Python objects (`[{},{},...]`) and loading takes ~0.5 s
# per MiB on a busy 2-core machine: 32 MiB (the app's upload cap) stays under 0.8 GB and 30 s, and
# is almost three times the largest run the project records (480 x 128 tokens: 12 MB of JSON).
MAX_JSON_BYTES = 32 * 1024 * 1024  # after decompression
MAX_FILE_BYTES = MAX_JSON_BYTES  # compressed or plain, as read from disk
MAX_INFLATE_RATIO = 200  # a tiny gzip that inflates to gigabytes is a bomb, not a trace
MAX_LENGTH = 10_000_000  # bound on any length/count field (slots, tokens, steps)
MAX_ABS_INT = MAX_LENGTH * 1000  # token ids can exceed lengths; past this an int is just absurd
GZIP_MAGIC = b"\x1f\x8b"


class TraceError(ValueError):
    """A file that cannot be read as a trace. The message is one line and names the problem."""


# ----------------------------------------------------------------------------- encoding


def trace_to_dict(trace: Trace) -> dict[str, Any]:
    """The JSON object `save_trace` writes, as Python values (one encoding path for both)."""
    return json.loads(trace_to_json(trace))


# Optional row fields that most rows leave unrecorded: written only when recorded, so a run that
# records them on a sampled few rows does not pay their bytes on every row (the loader restores
# the defaults).
_SPARSE_ROW_FIELDS = ("query_causal", "draft_position_ids", "draft_kv_lens", "kv_content_checked", "kv_mismatch_slot")


def _fields_of(obj: Any) -> dict[str, Any]:
    """json.dumps hook: our dataclasses hold only JSON values and other dataclasses."""
    if type(obj) is RowRecord:
        # Identity tests: slot 0 is a recorded value, and 0 == False.
        fields = obj.__dict__
        return {k: v for k, v in fields.items() if k not in _SPARSE_ROW_FIELDS or (v is not None and v is not False)}
    if dataclasses.is_dataclass(obj):
        return obj.__dict__
    raise TypeError(f"cannot serialise {type(obj).__name__} in a trace")


def trace_to_json(trace: Trace) -> str:
    # Much faster than dataclasses.asdict, which deep-copies every token list.
    body = {"format": FORMAT_NAME, "header": trace.header, "steps": trace.steps, "sequences": trace.sequences}
    return json.dumps(body, separators=(",", ":"), allow_nan=False, default=_fields_of)


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write atomically: a temp file in the same folder, then rename over the target.

    The container follows the name: `.parquet` is columnar, anything else JSON (`.gz`: gzip)."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            refuse_non_regular(path)
        except FileRefused as exc:
            raise TraceError(str(exc)) from None
        return save_parquet(trace, path)
    payload = trace_to_json(trace).encode()
    if path.name.endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    try:
        refuse_non_regular(path)  # os.replace would swap a device node (/dev/full) for a file
    except FileRefused as exc:
        raise TraceError(str(exc)) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_file_mode())  # mkstemp makes 0600; a trace is a normal file
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(payload)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


# ----------------------------------------------------------------------------- decoding


def _read_bytes(path: Path, max_bytes: int | None) -> bytes:
    limit = max_bytes
    if limit is None:  # a local file: as big as it is, if it fits in memory parsed
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # read_regular_file names the problem
        if size > _memory_limit():
            raise TraceError(_too_big_for_memory(path, size))
        limit = max(size, 1)
    try:  # regular files only: a FIFO, a device or /proc/kmsg would block or never end
        raw = read_regular_file(path, limit, "trace file")
    except FileRefused as exc:
        raise TraceError(str(exc)) from None
    if raw[:2] == GZIP_MAGIC:
        return _gunzip_bounded(raw, path, max_bytes)
    return raw


def _gunzip_bounded(raw: bytes, path: Path, max_bytes: int | None = MAX_JSON_BYTES) -> bytes:
    """Inflate in chunks so a decompression bomb is refused with bounded memory.

    `max_bytes=None` (a local file, the user's own): no cap, but a file too big for this
    machine's memory is refused with one line before it is half inflated.
    """
    if max_bytes is None:
        limit = _memory_limit()
    else:
        limit = min(max_bytes, max(len(raw) * MAX_INFLATE_RATIO, 64 * 1024 * 1024))
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            while chunk := stream.read(1 << 20):
                out.write(chunk)
                if out.tell() > limit:
                    if max_bytes is None:
                        raise TraceError(_too_big_for_memory(path, out.tell()))
                    raise TraceError(f"{path}: gzip inflates past {limit} bytes; refusing (decompression bomb?)")
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{path}: corrupt or truncated gzip ({exc})") from None
    return out.getvalue()


# Parsed JSON costs up to ~23x its text in Python objects; ~12x is typical of a trace.
JSON_MEMORY_FACTOR = 12


def _memory_limit() -> int:
    """The most JSON text this machine can hold parsed: available memory / JSON_MEMORY_FACTOR."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62
    return max(available // JSON_MEMORY_FACTOR, 64 * 1024 * 1024)


def _too_big_for_memory(source: Path | str, size: int) -> str:
    return (
        f"{source}: more than {size >> 20} MiB of JSON, too big to load into this machine's free memory; "
        "record big runs as Parquet (`--out run.parquet`), which `check` streams"
    )


def _refuse_constant(name: str) -> Any:
    raise TraceError(f"JSON contains {name}, which is not a valid number in a trace")


def parse_trace_bytes(
    raw: bytes, source: str = "<bytes>", max_bytes: int | None = MAX_JSON_BYTES, budget: Budget | None = DEFAULT_BUDGET
) -> Trace:
    """Parse a JSON trace held in memory. The defaults are an untrusted upload's limits: at most
    `max_bytes` of JSON after decompression and the semantic `budget` (None: no limit)."""
    if raw[:2] == GZIP_MAGIC:
        raw = _gunzip_bounded(raw, Path(source), max_bytes)
    elif max_bytes is not None and len(raw) > max_bytes:  # bytes from memory get the file limit too
        raise TraceError(f"{source}: {len(raw)} bytes of JSON, over the {max_bytes} byte limit")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{source}: not UTF-8 text at byte {exc.start}") from None
    if len(text) > 1 << 20 and top_level_kind(text) != "object":  # a big array of [] parses for seconds
        raise TraceError(f"{source}: top level: expected a JSON object, got {top_level_kind(text)}")
    try:
        # Item by item: a big upload must not hold the GIL (and every other visitor) for seconds.
        data = loads_yielding(text, parse_constant=_refuse_constant)
    except TraceError as exc:
        raise TraceError(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise TraceError(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal over Python's 4300-digit limit
        raise TraceError(f"{source}: unreadable JSON number ({exc})") from None
    except MemoryError:
        raise TraceError(_too_big_for_memory(source, len(text))) from None
    try:
        return trace_from_dict(data, budget)
    except TraceError as exc:
        raise TraceError(f"{source}: {exc}") from None


def load_trace(path: str | os.PathLike[str], max_bytes: int | None = None, budget: Budget | None = None) -> Trace:
    """Load a trace file, JSON (gzip optional) or Parquet, told apart by content.

    A local file is the user's own: by default no size cap and no semantic budget (a file too big
    for memory gets a one-line error). Pass the upload limits to load an untrusted file.
    """
    path = Path(path)
    if is_parquet(path):
        if max_bytes is not None or budget is not None:
            raise TraceError(f"{path}: a Parquet trace is read locally only; upload JSON instead")
        try:
            return ParquetTrace(path).read()
        except ColumnarError as exc:
            raise TraceError(str(exc)) from None
    try:
        raw = _read_bytes(path, max_bytes)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_trace_bytes(raw, str(path), max_bytes, budget)


def _check_format(data: Any) -> None:
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


def trace_from_dict(data: Any, budget: Budget | None = DEFAULT_BUDGET) -> Trace:
    _check_format(data)
    # Before any dataclass exists: a trace that declares more than views and checks may touch
    # costs only its parse.
    problem = over_budget(data, budget) if budget is not None else None
    if problem:
        raise TraceError(problem)
    body = {key: value for key, value in data.items() if key != "format"}
    trace = _CONVERTERS[Trace](body, "")
    _check_references(trace)
    return trace


def header_and_sequences_from_dict(data: Any) -> tuple[Header, list[SequenceRecord]]:
    """The header and sequences of a trace whose steps are stored elsewhere (the Parquet footer)."""
    _check_format(data)
    header = _CONVERTERS[Header](data.get("header"), "header")
    sequences = _build(list[SequenceRecord])(data.get("sequences"), "sequences")
    _check_header(header)
    _check_sequences(sequences)
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
    if value and (not all(type(v) is int for v in value) or max(value) > MAX_ABS_INT or min(value) < -MAX_ABS_INT):
        for i, v in enumerate(value):
            _int(v, f"{path}[{i}]")
    return value


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
        kwargs = {k: converters[k](v, prefix + k) for k, v in value.items()}
        return cls(**kwargs)

    _CONVERTERS[cls] = conv  # register before recursing (no cycles today, but cheap safety)
    for name, hint in hints.items():
        converters[name] = _build(hint)
    return conv


for _cls in (ModelInfo, Header, RowRecord, StepRecord, SequenceRecord, Trace):
    _build(_cls)


FINISH_REASONS = (None, "eos", "length")


def _nonneg(value: int | None, path: str) -> None:
    if value is not None and not 0 <= value <= MAX_LENGTH:
        _fail(path, f"must be between 0 and {MAX_LENGTH}, got {value}")


def _check_references(trace: Trace) -> None:
    """Structural sanity the checks need to even run; engine mistakes are left to forensics."""
    _check_header(trace.header)
    check_steps(trace.steps, _check_sequences(trace.sequences), -1)


def _check_header(h: Header) -> None:
    if h.method not in ("baseline", "eqspec", "exspec") and not h.method:
        _fail("header.method", "empty")
    if h.layout not in LAYOUTS:
        _fail("header.layout", f"expected one of {', '.join(LAYOUTS)}, got {h.layout!r}")
    _nonneg(h.draft_k, "header.draft_k")
    _nonneg(h.max_new_tokens, "header.max_new_tokens")
    if not 1 <= h.batch_size <= MAX_LENGTH:
        _fail("header.batch_size", f"must be at least 1, got {h.batch_size}")


def _check_sequences(sequences: list[SequenceRecord]) -> set[int]:
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
            _fail(f"{path}.finish_reason", f"unknown reason {seq.finish_reason!r}")
    return seq_ids


_ROW_COUNTS = (
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
            _check_row(row, f"{path}.rows[{r}]", seq_ids)
    return previous_step


def _check_row(row: RowRecord, rpath: str, seq_ids: set[int]) -> None:
    if row.seq_id not in seq_ids:
        _fail(f"{rpath}.seq_id", f"no sequence with id {row.seq_id}")
    if row.write_seq not in seq_ids:
        _fail(f"{rpath}.write_seq", f"no sequence with id {row.write_seq}")
    for name in _ROW_COUNTS:
        _nonneg(getattr(row, name), f"{rpath}.{name}")
    for j, count in enumerate(row.draft_kv_lens or ()):
        _nonneg(count, f"{rpath}.draft_kv_lens[{j}]")
    for j, run in enumerate(row.mask_rle):
        if len(run) != 2 or run[0] not in (0, 1) or not 0 <= run[1] <= MAX_LENGTH:
            _fail(f"{rpath}.mask_rle[{j}]", "expected [0 or 1, count >= 0]")
    if row.finish_reason not in FINISH_REASONS:
        _fail(f"{rpath}.finish_reason", f"unknown reason {row.finish_reason!r}")


def convert_trace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Copy a trace into the container `dst`'s suffix names; returns the number of steps.

    Parquet to Parquet and JSON to Parquet stream the steps (a JSON input is parsed whole first);
    a JSON output is written whole, so it needs the run in memory."""
    src, dst = Path(src), Path(dst)
    if is_parquet(src) and dst.suffix == ".parquet":
        try:
            source = ParquetTrace(src)
            writer = ParquetTraceWriter(dst)
            for step in source.iter_steps():
                writer.add_step(step)
        except ColumnarError as exc:
            raise TraceError(str(exc)) from None
        writer.close(source.header, source.sequences)
        return writer.steps_written
    trace = load_trace(src)
    save_trace(trace, dst)
    return len(trace.steps)
