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
VERSION = 4  # 2: placeholders, acceptance, paths and calibration, levels, rounds, findings, next steps
# 3: acceptance per draft position, a collapse's position, the replay command
# 4: each divergence's pair of compute paths, the noise per pair (docs/probe.md, "Noise per compute path")
READS = (1, 2, 3, 4)  # an older report reads with the newer fields at their defaults
MAX_REPORT_BYTES = 128 * 1024 * 1024
MAX_PROMPTS = 100_000
MAX_TEXT = 100_000  # characters in any one string field
VERDICTS = ("identical", "numerical", "unattributed", "suspect")
SOURCES = ("server", "replay", "none")
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
class Finding:
    kind: str  # special | script | loop (specviz.probe.scans)
    detail: str


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
    # version 2
    placeholders_a: int = 0  # tokens carrying a placeholder instead of a logprob (drafted tokens)
    placeholders_b: int = 0
    path: str = "plain"  # drafted | plain: the path the server reports it took
    concurrency: int | None = None  # the level this result is from (a sweep shows the worst)
    round: int = 0  # the round this result is from (the first with the worst verdict)
    rounds: int = 1  # rounds this prompt was compared in, at this level
    diverged_rounds: int = 0  # of them, rounds in which the answers differed
    findings: tuple[Finding, ...] = ()
    # version 4
    divergence_path: str | None = None  # the divergence's compute paths, A's first: "decode/verify"


@dataclass(frozen=True)
class PositionRate:
    """Acceptance at one draft position (specviz.probe.positions)."""

    position: int  # 0: the first draft token of a round
    accepted: int  # rounds whose drafts were accepted through this position
    rate: float  # accepted / rounds
    low: float  # its 95% interval (Wilson)
    high: float
    given: int  # rounds accepted through the position before (the rounds, at position 0)
    conditional: float | None  # accepted / given: this position, given the one before
    conditional_low: float | None
    conditional_high: float | None


@dataclass(frozen=True)
class Acceptance:
    """Speculative drafting of one pass, as the server reported it (specviz.probe.telemetry)."""

    source: str  # the adapter: llama.cpp | vllm | sglang | prometheus
    requests: int  # requests with telemetry (0: one aggregate from /metrics)
    drafted: int
    accepted: int
    rate: float | None  # accepted / drafted
    low: float | None  # its 95% interval
    high: float | None
    mean_length: float | None  # tokens per verify step
    unreadable: str | None = None  # telemetry present but not believable: why
    # version 3
    positions: tuple[PositionRate, ...] = ()  # per draft position, where the server counts it


@dataclass(frozen=True)
class Side:
    label: str  # e.g. "concurrency 1" or "server A"
    url: str  # credentials and query removed
    model: str | None
    concurrency: int
    # version 2
    tokens: int = 0  # tokens in this side's answers (where the server listed tokens)
    placeholders: int = 0  # of them, tokens with a placeholder, not a logprob
    acceptance: Acceptance | None = None


@dataclass(frozen=True)
class PathNoise:
    path: str
    prompts: int
    estimate: float
    typical: float | None
    baseline: float | None
    cut: float | None  # a prompt whose median change is above this stands out
    cut_max: float | None  # ... or whose largest change is above this
    pooled: bool  # too few prompts on this path: the pooled cuts were used


@dataclass(frozen=True)
class PairNoise:
    """The noise measured on one pair of compute paths (specviz.probe.paths)."""

    pair: str  # side A's path / side B's path: prompt | decode | verify
    tokens: int  # margin changes measured
    prompts: int
    estimate: float  # the largest of them
    source: str  # shared tokens | recomputed | both
    measured: bool  # enough to judge a divergence on this pair


@dataclass(frozen=True)
class Calibration:
    source: str  # what was compared with what
    prompts: int
    typical: float  # the largest median change of a prompt, side A against side A again
    largest: float  # the largest change at any shared token


@dataclass(frozen=True)
class Noise:
    estimate: float  # the tolerance: largest margin change on a non-outlier prompt's shared prefix
    typical: float | None
    baseline: float | None
    cut: float | None  # a prompt whose median change is above this stands out
    prompts: int
    source: str  # server | replay | none
    # version 2
    cut_max: float | None = None  # ... or whose largest change is above this
    paths: tuple[PathNoise, ...] = ()
    calibration: Calibration | None = None
    batch_cut: float | None = None  # from batches of copies of one prompt: no prompt needs more to stand out
    batch_cut_max: float | None = None
    # version 4
    pairs: tuple[PairNoise, ...] = ()  # per pair of compute paths: a divergence is judged only on its own


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
class Level:
    """One concurrency level of a sweep against level 1 (every round)."""

    concurrency: int
    comparisons: int  # prompts x rounds
    diverged: int
    rate: float  # diverged / comparisons
    low: float  # its 95% interval (Wilson)
    high: float
    counts: dict[str, int]  # verdicts of the comparisons
    verdict: str
    noise: float
    placeholders: int
    tokens: int
    acceptance: Acceptance | None
    collapse: bool  # acceptance clearly below level 1's


@dataclass(frozen=True)
class Collapse:
    concurrency: int  # the first level where acceptance collapsed
    rate_1: float  # acceptance at level 1
    rate: float  # acceptance there
    detail: str
    # version 3
    position: int | None = None  # the draft position that collapsed (None: the overall rate did)


@dataclass(frozen=True)
class ReplayCommand:
    """The command that replays a flagged run offline under the watch (specviz.probe.locate)."""

    engine: str  # vllm | transformers
    command: str
    prompts: tuple[int, ...]  # the flagged prompts (--focus)
    max_num_seqs: int  # the batch limit: the flagged level's concurrency
    note: str  # what the replay can and cannot show


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
    # version 2
    rounds: int = 1
    levels: tuple[Level, ...] = ()  # one per concurrency level (batch mode)
    collapse: Collapse | None = None  # acceptance collapsed under concurrency: exit 1
    next_steps: tuple[str, ...] = ()
    # version 3
    replay_command: ReplayCommand | None = None  # a failed run against an engine specviz can run

    @property
    def failed(self) -> bool:
        """Exit 1: a suspect or unattributed prompt, or an acceptance collapse."""
        return self.verdict in ("suspect", "unattributed") or self.collapse is not None


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


def _fields(cls: type) -> list[tuple[str, Any, bool]]:
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
    for name, hint, optional in _fields(cls):
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


# -----------------------------------------------------------------------------------------------
# The JSON Schema (docs/probe.schema.json is this, written by `python -m specviz.probe.report`)


def json_schema() -> dict[str, Any]:
    """The report's JSON Schema, from the dataclasses: a field with a default (a version-2
    addition) is optional, so version-1 reports validate too."""
    defs: dict[str, Any] = {}

    def of(hint: Any) -> dict[str, Any]:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            (inner,) = [a for a in args if a is not type(None)]
            return {"anyOf": [of(inner), {"type": "null"}]}
        if dataclasses.is_dataclass(hint):
            name = hint.__name__
            if name not in defs:
                defs[name] = {}
                defs[name] = obj(hint)
            return {"$ref": f"#/$defs/{name}"}
        if origin is tuple:
            return {"type": "array", "items": of(args[0])}
        if origin is dict:
            return {"type": "object", "additionalProperties": of(args[1]), "maxProperties": 64}
        simple = {bool: "boolean", int: "integer", float: "number"}
        if hint in simple:
            return {"type": simple[hint]}
        return {"type": "string", "maxLength": MAX_TEXT}

    def obj(cls: Any) -> dict[str, Any]:
        fields = _fields(cls)
        return {
            "type": "object",
            "required": [name for name, _, optional in fields if not optional],
            "properties": {name: of(hint) for name, hint, _ in fields},
        }

    schema = obj(ProbeReport)
    props = schema["properties"]
    props["format"] = {"const": FORMAT}
    props["version"] = {"enum": list(READS)}
    props["verdict"] = {"enum": list(VERDICTS)}
    props["mode"] = {"enum": ["batch", "ab"]}
    props["endpoint"] = {"enum": ["completions", "chat"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://specviz/docs/probe.schema.json",
        "title": "specviz probe report",
        "description": "Written by `specviz probe --out`; see docs/probe.md. Readers ignore unknown fields.",
        **schema,
        "$defs": defs,
    }


if __name__ == "__main__":  # regenerates docs/probe.schema.json
    out = Path(__file__).resolve().parents[2] / "docs" / "probe.schema.json"
    out.write_text(json.dumps(json_schema(), indent=2) + "\n", encoding="utf-8")
