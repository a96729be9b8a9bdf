"""The probe's report: typed dataclasses, the versioned JSON file, and its validating loader.

pandas-free and torch-free, for the app: `load_report(path)` reads an untrusted file (size
limits, one-line errors naming the field) into a `ProbeReport`; `divergence_matrix` lays the
prompts out as the divergence map draws them. Format: docs/probe.md, docs/probe.schema.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specviz.errors import SpecvizError
from specviz.files import FileRefused, read_regular_file

FORMAT = "specviz-probe"
VERSION = 1
MAX_REPORT_BYTES = 128 * 1024 * 1024
MAX_PROMPTS = 100_000
MAX_TEXT = 100_000  # characters in any one string field
VERDICTS = ("identical", "numerical", "unattributed", "suspect")
# divergence_matrix cell codes
PAST_END, SHARED, DIVERGED, AFTER = -1, 0, 1, 2


class ReportError(SpecvizError):
    """A probe report file that cannot be read; one line naming the file and the field."""


@dataclass(frozen=True)
class TokenView:
    text: str
    id: int | None
    logprob_a: float | None  # this token's logprob on side A (None: not in A's top list)
    logprob_b: float | None


@dataclass(frozen=True)
class PromptResult:
    index: int
    prompt: str  # a preview (first 200 characters)
    verdict: str  # identical | numerical | unattributed | suspect
    reason: str
    length_a: int  # answer lengths, in `unit`s
    length_b: int
    unit: str  # token | char
    divergence: int | None  # first divergent index
    token_a: TokenView | None
    token_b: TokenView | None
    context: str  # shared text before the divergence (last 80 characters)
    prefix_tokens: int
    prefix_median: float | None
    prefix_max: float | None
    gap_a: float | None
    gap_b: float | None
    swing: float | None
    top_margin_a: float | None
    lower_bound: bool
    stands_out: bool
    evidence: str  # server | replay | none
    nondeterministic_at: int | None  # first index where a repeat of the concurrent pass differed


@dataclass(frozen=True)
class Side:
    label: str  # e.g. "concurrency 1" or "server A"
    url: str  # credentials and query removed
    model: str | None
    concurrency: int


@dataclass(frozen=True)
class Noise:
    estimate: float  # the tolerance: largest margin change on a non-outlier prompt's shared prefix
    typical: float | None
    baseline: float | None
    cut: float | None
    prompts: int
    source: str  # server | replay | none


@dataclass(frozen=True)
class Timing:
    wall_s: float
    server_busy_s: float  # wall time with at least one request outstanding
    overhead_s: float  # wall time with none: the probe's own work
    overhead_fraction: float
    client_cpu_s: float
    replay_s: float  # local model time (--replay), not counted as overhead
    requests: int


@dataclass(frozen=True)
class ProbeReport:
    format: str
    version: int
    created: str
    verdict: str
    mode: str  # batch (one URL: alone vs concurrent) | ab (two URLs)
    endpoint: str  # completions | chat
    max_tokens: int
    logprobs: int
    repeats: int
    replay: str | None
    side_a: Side
    side_b: Side
    counts: dict[str, int]
    nondeterministic: int
    noise: Noise
    timing: Timing
    prompts: tuple[PromptResult, ...]


# -----------------------------------------------------------------------------------------------
# Writing


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_dict(report: ProbeReport) -> dict[str, Any]:
    return _plain(dataclasses.asdict(report))


def save_report(report: ProbeReport, path: str | os.PathLike[str]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(to_dict(report), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# -----------------------------------------------------------------------------------------------
# Reading (untrusted)


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
    if payload.get("version") != VERSION:
        raise ReportError(f"{where}: probe report version {payload.get('version')!r}; this specviz reads {VERSION}")
    if isinstance(payload.get("prompts"), list) and len(payload["prompts"]) > MAX_PROMPTS:
        raise ReportError(f"{where}: more than {MAX_PROMPTS} prompts")
    report = _build(ProbeReport, payload, where)
    _check(report, where)
    return report


def _check(report: ProbeReport, where: str) -> None:
    if report.verdict not in VERDICTS:
        raise ReportError(f"{where}: verdict: {report.verdict!r} is not one of {', '.join(VERDICTS)}")
    for n, p in enumerate(report.prompts):
        if p.verdict not in VERDICTS:
            raise ReportError(f"{where}: prompts[{n}].verdict: {p.verdict!r} is not one of {', '.join(VERDICTS)}")
        if p.divergence is not None and not 0 <= p.divergence <= max(p.length_a, p.length_b):
            raise ReportError(f"{where}: prompts[{n}].divergence: {p.divergence} outside the answers")
        if min(p.length_a, p.length_b, p.prefix_tokens) < 0:
            raise ReportError(f"{where}: prompts[{n}]: negative length")
    if report.mode not in ("batch", "ab"):
        raise ReportError(f"{where}: mode: {report.mode!r} is not batch or ab")


def _build(cls: type, obj: Any, where: str) -> Any:
    if not isinstance(obj, dict):
        raise ReportError(f"{where}: expected an object")
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            raise ReportError(f"{where}.{f.name}: missing")
        values[f.name] = _value(hints[f.name], obj[f.name], f"{where}.{f.name}")
    return cls(**values)


def _value(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value, where)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise ReportError(f"{where}: expected a list")
        return tuple(_value(args[0], v, f"{where}[{n}]") for n, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict) or len(value) > 64:
            raise ReportError(f"{where}: expected an object (at most 64 keys)")
        return {str(k)[:64]: _value(args[1], v, f"{where}.{k}") for k, v in value.items()}
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


# -----------------------------------------------------------------------------------------------
# For the app's views


def divergence_matrix(report: ProbeReport, width: int | None = None) -> list[list[int]]:
    """One row per prompt (report order), one column per answer position up to `width` (default:
    the longest answer): SHARED before the first divergence, DIVERGED at it, AFTER past it on
    either side's answer, PAST_END beyond both answers.

    E.g. lengths 5 and 4, divergence 3, width 6 -> [0, 0, 0, 1, 2, -1].
    """
    if width is None:
        width = max((max(p.length_a, p.length_b) for p in report.prompts), default=0)
    rows = []
    for p in report.prompts:
        end = max(p.length_a, p.length_b)
        d = p.divergence if p.divergence is not None else end
        rows.append(
            [PAST_END if j >= end else SHARED if j < d else DIVERGED if j == d else AFTER for j in range(width)]
        )
    return rows


def verdict_codes(report: ProbeReport) -> list[int]:
    """Each prompt's verdict as its index in VERDICTS (0 identical ... 3 suspect)."""
    return [VERDICTS.index(p.verdict) for p in report.prompts]
