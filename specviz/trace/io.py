"""Save and load traces: JSON (gzip optional) or Parquet, atomic writes, strict validation on load.

Nothing in a trace is ever executed: the file is parsed with `json` and every value is checked
against the dataclass field types before a `Trace` exists. Any problem raises `TraceError` with a
one-line message naming the field (e.g. `steps[3].rows[1].accepted: expected int, got str`).
"""

from __future__ import annotations

__all__ = [
    "TraceError",
    "convert_trace",
    "load_trace",
    "open_trace",
    "parse_trace_bytes",
    "save_trace",
    "trace_from_dict",
    "trace_to_dict",
    "trace_to_json",
]

import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any

from specviz.files import (
    FileRefused,
    InflatesTooFar,
    inflate_bounded,
    read_regular_file,
    refuse_non_regular,
    umask_file_mode,
)
from specviz.trace.budget import (
    DEFAULT_BUDGET,
    NO_LIMITS_HINT,
    Budget,
    budget_items,
    file_limits,
    json_parse_bytes,
    over_budget,
)
from specviz.trace.columnar import ColumnarError, ParquetTraceWriter, is_parquet, save_parquet
from specviz.trace.columnar_read import ParquetTrace
from specviz.trace.file_kinds import not_a_trace
from specviz.trace.jsonparse import TooMany, loads_yielding, top_level_kind
from specviz.trace.schema import FORMAT_NAME, Trace, json_fields
from specviz.trace.validate import TraceError, build_trace, check_format

# Parsed JSON costs up to ~23x its text in Python objects (`[{},{},...]`) and loading takes ~0.5 s
# per MiB on a busy 2-core machine: 32 MiB (the app's upload cap) stays under 0.8 GB and 30 s, and
# is almost three times the largest run the project records (480 x 128 tokens: 12 MB of JSON).
MAX_JSON_BYTES = 32 * 1024 * 1024  # after decompression
MAX_FILE_BYTES = MAX_JSON_BYTES  # compressed or plain, as read from disk
MAX_INFLATE_RATIO = 200  # a tiny gzip that inflates to gigabytes is a bomb, not a trace
GZIP_MAGIC = b"\x1f\x8b"


# ----------------------------------------------------------------------------- encoding


def trace_to_dict(trace: Trace) -> dict[str, Any]:
    """The JSON object `save_trace` writes, as Python values (one encoding path for both)."""
    return json.loads(trace_to_json(trace))


def trace_to_json(trace: Trace) -> str:
    # Much faster than dataclasses.asdict, which deep-copies every token list.
    body = {"format": FORMAT_NAME, "header": trace.header, "steps": trace.steps, "sequences": trace.sequences}
    return json.dumps(body, separators=(",", ":"), allow_nan=False, default=json_fields)


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
    if limit is None:  # a local file: as big as it is, if it fits in memory parsed (and the limits)
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # read_regular_file names the problem
        if size > _memory_limit():
            raise TraceError(_too_big_for_memory(path, size))
        limits = file_limits()
        if limits is not None and size > limits.json_bytes and not _is_gzip(path):
            what = f"{size >> 20} MiB of JSON, more than the {limits.json_bytes >> 20} MiB a local trace may hold"
            raise TraceError(_over_local_limit(path, what))
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
    limits = file_limits()
    if max_bytes is None:
        limit = _memory_limit() if limits is None else min(_memory_limit(), limits.json_bytes)
    else:
        limit = min(max_bytes, max(len(raw) * MAX_INFLATE_RATIO, 64 * 1024 * 1024))
    try:
        return inflate_bounded(raw, limit)
    except InflatesTooFar as exc:
        if max_bytes is None and limits is not None and limit == limits.json_bytes:
            what = f"gzip inflating past the {limit >> 20} MiB of JSON a local trace may hold"
            raise TraceError(_over_local_limit(path, what)) from None
        if max_bytes is None:
            raise TraceError(_too_big_for_memory(path, exc.size)) from None
        raise TraceError(f"{path}: gzip inflates past {limit} bytes; refusing (decompression bomb?)") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{path}: corrupt or truncated gzip ({exc})") from None


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


def _over_local_limit(path: Path | str, what: str) -> str:
    """One line, the file named (not its folders): a local read refused by `FileLimits`."""
    return f"{Path(path).name}: {what}; {NO_LIMITS_HINT}"


def _is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(2) == GZIP_MAGIC
    except OSError:
        return False


def _refuse_constant(name: str) -> Any:
    raise TraceError(f"JSON contains {name}, which is not a valid number in a trace")


def parse_trace_bytes(
    raw: bytes,
    source: str = "<bytes>",
    max_bytes: int | None = MAX_JSON_BYTES,
    budget: Budget | None = DEFAULT_BUDGET,
    parse_limit: int | None = None,
) -> Trace:
    """Parse a JSON trace held in memory. The defaults are an untrusted upload's limits: at most
    `max_bytes` of JSON after decompression and the semantic `budget` (None: no limit); with
    `parse_limit`, text whose parse would take more (`json_parse_bytes`) is refused unparsed."""
    return _parse_text(_json_text(raw, source, max_bytes), source, budget, parse_limit)


def _json_text(raw: bytes, source: str, max_bytes: int | None) -> str:
    """The JSON text of a trace's bytes (gzip or not), within `max_bytes`."""
    if (refused := not_a_trace(source, raw[:16])) is not None:  # a picture picked by mistake: say so
        raise TraceError(refused)
    if raw[:2] == GZIP_MAGIC:
        raw = _gunzip_bounded(raw, Path(source), max_bytes)
    elif max_bytes is not None and len(raw) > max_bytes:  # bytes from memory get the file limit too
        raise TraceError(f"{source}: {len(raw)} bytes of JSON, over the {max_bytes} byte limit")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{source}: not UTF-8 text at byte {exc.start}") from None


def _parse_text(text: str, source: str, budget: Budget | None, parse_limit: int | None) -> Trace:
    """Parse, then let the text go before the trace is built from the parse: the text, its parse
    and the trace are never all held at once (called with a temporary, this is the text's only
    reference)."""
    if len(text) > 1 << 20 and top_level_kind(text) != "object":  # a big array of [] parses for seconds
        raise TraceError(f"{source}: top level: expected a JSON object, got {top_level_kind(text)}")
    if parse_limit is not None and (cost := json_parse_bytes(text)) > parse_limit:
        what = f"JSON whose parse would take ~{cost >> 20} MiB, more than the {parse_limit >> 20} MiB allowed"
        raise TraceError(_over_local_limit(source, what))
    size = len(text)
    try:
        # Item by item: a big upload must not hold the GIL (and every other visitor) for seconds.
        data = loads_yielding(text, parse_constant=_refuse_constant, max_items=budget_items(budget))
    except TraceError as exc:
        raise TraceError(f"{source}: {exc}") from None
    except TooMany as exc:  # refused mid-parse: the rest of a huge container is never built
        raise TraceError(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise TraceError(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal over Python's 4300-digit limit
        raise TraceError(f"{source}: unreadable JSON number ({exc})") from None
    except MemoryError:
        raise TraceError(_too_big_for_memory(source, size)) from None
    del text
    try:
        return trace_from_dict(data, budget)
    except TraceError as exc:
        raise TraceError(f"{source}: {exc}") from None


def open_trace(path: str | os.PathLike[str]) -> Trace:
    """A local trace for one walk over its steps: a JSON trace is loaded whole; a Parquet trace's
    `steps` are read from disk a row group at a time as they are used (`ParquetSteps`), so a
    check of a run of any length holds one row group, the header and the sequences."""
    path = Path(path)
    if not is_parquet(path):
        return load_trace(path)
    try:
        return ParquetTrace(path).open()
    except ColumnarError as exc:
        raise TraceError(str(exc)) from None


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
    limits = file_limits() if max_bytes is None else None
    parse_limit = limits.parse_bytes if limits else None
    # The bytes go once decoded and the text once parsed: at most two of bytes, text, parse, trace.
    return _parse_text(_file_text(path, max_bytes), str(path), budget, parse_limit)


def _file_text(path: Path, max_bytes: int | None) -> str:
    try:
        raw = _read_bytes(path, max_bytes)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _json_text(raw, str(path), max_bytes)


def trace_from_dict(data: Any, budget: Budget | None = DEFAULT_BUDGET) -> Trace:
    check_format(data)
    # Before any dataclass exists: a trace that declares more than views and checks may touch
    # costs only its parse.
    problem = over_budget(data, budget) if budget is not None else None
    if problem:
        raise TraceError(problem)
    body = {key: value for key, value in data.items() if key != "format"}
    trace = build_trace(body)
    return trace


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
