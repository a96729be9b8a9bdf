"""Reading a probe report from an untrusted file or payload: size limits, the version it was
written at (a field added later may be absent: its default), every field's type, and one-line
errors naming the field (`ReportError`); report text never reaches a message.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from typing import Any

from specviz.files import FileRefused, read_regular_file
from specviz.probe.report import (
    FORMAT,
    MAX_PROMPTS,
    MAX_REPORT_BYTES,
    MAX_TEXT,
    READS,
    SOURCES,
    VERDICTS,
    VERSION,
    ProbeReport,
    ReportError,
)


def load_report(path: str | os.PathLike[str]) -> ProbeReport:
    try:
        data = read_regular_file(path, MAX_REPORT_BYTES, "probe report")
    except FileRefused as exc:
        raise ReportError(str(exc)) from None
    try:
        payload = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise ReportError(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None
    return parse_report(payload, str(path))


def parse_report(payload: Any, where: str = "report") -> ProbeReport:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ReportError(f"{where}: not a specviz probe report (format must be {FORMAT!r})")
    version = payload.get("version")
    if isinstance(version, bool) or version not in READS:
        raise ReportError(f"{where}: probe report version {version!r}; this specviz reads {', '.join(map(str, READS))}")
    if isinstance(payload.get("prompts"), list) and len(payload["prompts"]) > MAX_PROMPTS:
        raise ReportError(f"{where}: more than {MAX_PROMPTS} prompts")
    report = _build(ProbeReport, payload, where, version)
    _check(report, where)
    return report


def _one_of(value: str, allowed: tuple[str, ...], where: str) -> None:
    if value not in allowed:  # the value is not quoted: report text never reaches a message
        raise ReportError(f"{where}: not one of {', '.join(allowed)}")


def _check(report: ProbeReport, where: str) -> None:
    _one_of(report.verdict, VERDICTS, f"{where}: verdict")
    _one_of(report.noise.source, SOURCES, f"{where}: noise.source")
    for n, level in enumerate(report.levels):
        _one_of(level.verdict, VERDICTS, f"{where}: levels[{n}].verdict")
    for n, p in enumerate(report.prompts):
        _one_of(p.verdict, VERDICTS, f"{where}: prompts[{n}].verdict")
        _one_of(p.unit, ("token", "char"), f"{where}: prompts[{n}].unit")
        _one_of(p.evidence, SOURCES, f"{where}: prompts[{n}].evidence")
        if p.divergence is not None and not 0 <= p.divergence <= max(p.length_a, p.length_b):
            raise ReportError(f"{where}: prompts[{n}].divergence: {p.divergence} outside the answers")
        if min(p.length_a, p.length_b, p.prefix_tokens) < 0:
            raise ReportError(f"{where}: prompts[{n}]: negative length")
    if report.mode not in ("batch", "ab"):
        raise ReportError(f"{where}: mode: {report.mode!r} is not batch or ab")


_FIELDS: dict[type, list[tuple[str, Any, bool]]] = {}


def fields_of(cls: type) -> list[tuple[str, Any, bool]]:
    """(name, type hint, has a default) per field; cached: type hints cost more than a prompt."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = [(f.name, hints[f.name], f.default is not dataclasses.MISSING) for f in dataclasses.fields(cls)]
    return _FIELDS[cls]


# The version that added a field with a default; any other such field came with version 2.
SINCE = {
    ("Acceptance", "positions"): 3,
    ("Collapse", "position"): 3,
    ("ProbeReport", "replay_command"): 3,
    ("PromptResult", "divergence_path"): 4,
    ("Noise", "pairs"): 4,
}


def _build(cls: type, obj: Any, where: str, version: int = VERSION) -> Any:
    """`cls` from a JSON object of report `version`: a field added after it may be absent (its
    default); every field of that version must be there."""
    if not isinstance(obj, dict):
        raise ReportError(f"{where}: expected an object")
    values = {}
    for name, hint, optional in fields_of(cls):
        if name not in obj:
            if optional and SINCE.get((cls.__name__, name), 2) > version:
                continue
            raise ReportError(f"{where}.{name}: missing")
        values[name] = _value(hint, obj[name], f"{where}.{name}", version)
    return cls(**values)


def _value(hint: Any, value: Any, where: str, version: int = VERSION) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value, where, version)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where, version)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list):
            raise ReportError(f"{where}: expected a list")
        if len(value) > MAX_PROMPTS:
            raise ReportError(f"{where}: more than {MAX_PROMPTS} items")
        return tuple(_value(args[0], v, f"{where}[{n}]", version) for n, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict) or len(value) > 64:
            raise ReportError(f"{where}: expected an object (at most 64 keys)")
        return {str(k)[:64]: _value(args[1], v, f"{where}[{n}]") for n, (k, v) in enumerate(value.items())}
    if hint is bool:
        if not isinstance(value, bool):
            raise ReportError(f"{where}: expected true or false")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) > 2**53:
            raise ReportError(f"{where}: expected an integer")
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ReportError(f"{where}: expected a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ReportError(f"{where}: expected a string (at most {MAX_TEXT} characters)")
        return value
    raise ReportError(f"{where}: unsupported field type")  # pragma: no cover - a bug in this module
