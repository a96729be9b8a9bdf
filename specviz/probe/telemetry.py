"""Speculative-decoding telemetry, as servers report it: drafted and accepted tokens per request
or per pass, and the acceptance they imply.

Servers say how much they drafted in different places; each place is one row of `ADAPTERS`
(a name, where it reads, and a reader). To support another server, add a row. A reader returns
None when its fields are absent, a `Drafting` when they are present and valid, and raises
`TelemetryError` (one line naming the field) when they are present but not believable: a server's
answer is untrusted input, so a wrong type, a negative count or more accepted than drafted makes
the telemetry unreadable, never a traceback and never a number the verdict would rely on.

Terms: *drafted* = draft tokens proposed to the target; *accepted* = those the target kept;
*acceptance rate* = accepted / drafted; *steps* = target verify forwards; *mean acceptance
length* = tokens emitted per verify step (1 + accepted / steps where steps are counted; a
plain decode has length 1).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specviz.errors import SpecvizError

MAX_COUNT = 10**12  # a count above this is not a count
MAX_POSITIONS = 64  # draft positions read at most (servers draft a handful)
Z95 = 1.959964  # two-sided 95% normal quantile
# A collapse: acceptance at a level below level 1's by at least this much (absolute), with the
# 95% intervals apart. Under greedy decoding acceptance does not depend on the batch in exact
# arithmetic (the draft and the target see the same tokens), so only near-tie flips move it a
# little; a drop of a tenth with separated intervals is a batching bug in the drafting.
COLLAPSE_DROP = 0.10
# Where a server reports only verify steps and tokens (SGLang's meta_info), the same test on the
# mean acceptance length: intervals apart and at least this many fewer tokens per verify step.
COLLAPSE_LENGTH_DROP = 0.25


class TelemetryError(SpecvizError):
    """Telemetry fields present but not believable (one line)."""


@dataclass(frozen=True)
class Drafting:
    """One request's (or one pass's) drafting counters; None where the server does not say."""

    drafted: int | None
    accepted: int | None
    steps: int | None = None  # target verify forwards
    tokens: int | None = None  # tokens the request emitted
    drafts: int | None = None  # draft rounds (vLLM's num_drafts)
    positions: tuple[int, ...] | None = None  # rounds accepted through each draft position (specviz.probe.positions)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TelemetryError(f"{where} is not a number")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise TelemetryError(f"{where} is not a whole number")
    if not 0 <= value <= MAX_COUNT:
        raise TelemetryError(f"{where} = {value:g} is out of range")
    return int(value)


def _optional(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    return _count(obj[key], f"{where}.{key}") if obj.get(key) is not None else None


def _checked(d: Drafting, where: str) -> Drafting:
    if d.drafted is not None and d.accepted is not None and d.accepted > d.drafted:
        raise TelemetryError(f"{where}: {d.accepted} accepted of {d.drafted} drafted")
    if d.tokens is not None and d.accepted is not None and d.accepted > d.tokens:
        raise TelemetryError(f"{where}: {d.accepted} accepted of {d.tokens} tokens emitted")
    return d


def read_llama_cpp(payload: Mapping[str, Any]) -> Drafting | None:
    """llama.cpp `llama-server`: `timings.draft_n`, `timings.draft_n_accepted` (and
    `predicted_n`); each verify step emits one token of its own, so steps = predicted_n - accepted."""
    t = payload.get("timings")
    if not isinstance(t, dict) or "draft_n" not in t:
        return None
    drafted = _count(t["draft_n"], "timings.draft_n")
    accepted = _count(t.get("draft_n_accepted", 0), "timings.draft_n_accepted")
    tokens = _optional(t, "predicted_n", "timings")
    steps = tokens - accepted if tokens is not None and tokens >= accepted else None
    return _checked(Drafting(drafted, accepted, steps, tokens), "timings")


def read_vllm_request(payload: Mapping[str, Any]) -> Drafting | None:
    """vLLM with `--per-request-spec-decode-metrics`: `metrics.speculative_decoding` with
    `num_draft_tokens`, `num_accepted_draft_tokens`, `num_spec_steps` (experimental in vLLM)."""
    m = payload.get("metrics")
    s = m.get("speculative_decoding") if isinstance(m, dict) else None
    if not isinstance(s, dict):
        return None
    where = "metrics.speculative_decoding"
    drafted = _count(s.get("num_draft_tokens"), f"{where}.num_draft_tokens")
    accepted = _count(s.get("num_accepted_draft_tokens"), f"{where}.num_accepted_draft_tokens")
    steps = _optional(s, "num_spec_steps", where)
    return _checked(Drafting(drafted, accepted, steps, None, steps), where)


def read_sglang(payload: Mapping[str, Any]) -> Drafting | None:
    """SGLang: `meta_info.spec_verify_ct` (verify steps) with `completion_tokens`; newer versions
    add `spec_accept_token_num` / `spec_draft_token_num`. Top level (native /generate) or in the
    choice (OpenAI endpoints with meta_info on)."""
    meta = payload.get("meta_info")
    if not isinstance(meta, dict):
        choices = payload.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        meta = first.get("meta_info")
    if not isinstance(meta, dict) or "spec_verify_ct" not in meta:
        return None
    steps = _count(meta["spec_verify_ct"], "meta_info.spec_verify_ct")
    tokens = _optional(meta, "completion_tokens", "meta_info")
    drafted = _optional(meta, "spec_draft_token_num", "meta_info")
    accepted = _optional(meta, "spec_accept_token_num", "meta_info")
    if accepted is None and tokens is not None and tokens >= steps:
        accepted = tokens - steps  # each verify step emits one token of the target's own
    rounds, positions = steps, None
    for key in ("spec_accept_histogram", "spec_correct_drafts_histogram"):  # current and older names
        if meta.get(key) is not None:
            rounds, positions = from_histogram(meta[key], f"meta_info.{key}")
            break
    return _checked(Drafting(drafted, accepted, steps, tokens, rounds, positions), "meta_info")


def from_histogram(histogram: Any, where: str) -> tuple[int, tuple[int, ...]]:
    """(rounds, rounds accepted through each draft position) from SGLang's acceptance histogram
    (H[n]: verify rounds that accepted exactly n draft tokens, so position i was accepted in the
    rounds with n > i); TelemetryError when it is not a short list of counts."""
    if not isinstance(histogram, list) or len(histogram) > MAX_POSITIONS + 1:
        raise TelemetryError(f"{where} is not a list of at most {MAX_POSITIONS + 1} counts")
    counts = [_count(h, f"{where}[{n}]") for n, h in enumerate(histogram)]
    return sum(counts), tuple(sum(counts[n + 1 :]) for n in range(len(counts) - 1))


@dataclass(frozen=True)
class Adapter:
    name: str
    reads: str  # where, for the docs and the report
    read: Callable[[Mapping[str, Any]], Drafting | None]


ADAPTERS: tuple[Adapter, ...] = (
    Adapter("llama.cpp", "timings.draft_n / draft_n_accepted / predicted_n", read_llama_cpp),
    Adapter("vllm", "metrics.speculative_decoding.num_draft_tokens / num_accepted_draft_tokens", read_vllm_request),
    Adapter("sglang", "meta_info.spec_verify_ct / completion_tokens / spec_*_token_num", read_sglang),
)


def read_response(payload: Any) -> tuple[str | None, Drafting | None, str | None]:
    """(adapter name, drafting, error) from one response; the first adapter whose fields are
    there wins. (None, None, None): no telemetry in this answer."""
    if not isinstance(payload, dict):
        return None, None, None
    for adapter in ADAPTERS:
        try:
            found = adapter.read(payload)
        except TelemetryError as exc:
            return adapter.name, None, str(exc)
        if found is not None:
            return adapter.name, found, None
    return None, None, None


def cached_tokens(payload: Mapping[str, Any]) -> int:
    """Prompt tokens the server says it took from its prefix cache (0 when it does not say, or
    says something unbelievable): OpenAI/vLLM `usage.prompt_tokens_details.cached_tokens`,
    llama.cpp `timings.cache_n`, SGLang `meta_info.cached_tokens`."""
    usage = payload.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    timings, meta = payload.get("timings"), payload.get("meta_info")
    for holder, key in ((details, "cached_tokens"), (timings, "cache_n"), (meta, "cached_tokens")):
        if isinstance(holder, dict) and holder.get(key) is not None:
            try:
                return _count(holder[key], key)
            except TelemetryError:
                return 0
    return 0


# -----------------------------------------------------------------------------------------------
# Prometheus counters (vLLM's /metrics), read around a pass: the pass's drafting is the delta.

PROMETHEUS_COUNTERS = {
    "drafted": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
}
# accepted tokens per draft position, one sample per `position="i"` label; filed as `NAME[i]`
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION_LABEL = re.compile(r'(?:^|[{,])\s*position\s*=\s*"(\d{1,2})"')


def position_key(position: int) -> str:
    """Where `parse_prometheus` files the per-position counter of draft position `position`."""
    return f"{PER_POSITION}[{position}]"


def parse_prometheus(text: str) -> dict[str, float]:
    """The spec-decode counters in a Prometheus text exposition, summed over label sets (one per
    model or engine). Missing counters are absent from the result."""
    wanted = {*PROMETHEUS_COUNTERS.values(), PER_POSITION}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        name = m.group(1)
        if name == PER_POSITION:
            label = _POSITION_LABEL.search(m.group(2) or "")
            if label is None or int(label.group(1)) >= MAX_POSITIONS:
                continue
            name = position_key(int(label.group(1)))
        try:
            value = float(m.group(3))
        except ValueError:
            raise TelemetryError(f"/metrics: {m.group(1)} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise TelemetryError(f"/metrics: {m.group(1)} = {m.group(3)[:20]} is out of range")
        out[name] = out.get(name, 0.0) + value
    return out


def prometheus_delta(before: Mapping[str, float], after: Mapping[str, float]) -> Drafting | None:
    """The drafting between two scrapes; None when the server exposes no draft counter."""
    name = PROMETHEUS_COUNTERS["drafted"]
    if name not in before or name not in after:
        return None
    values = {}
    for key, metric in PROMETHEUS_COUNTERS.items():
        if metric in before and metric in after:
            values[key] = _delta(before, after, metric)
    positions = []
    while len(positions) < MAX_POSITIONS and position_key(len(positions)) in before.keys() & after.keys():
        positions.append(_delta(before, after, position_key(len(positions))))
    drafts = values.get("drafts")
    if positions and (drafts is None or max(positions) > drafts):
        raise TelemetryError("/metrics: more rounds accepted at a draft position than draft rounds")
    return _checked(
        Drafting(values["drafted"], values.get("accepted"), drafts, None, drafts, tuple(positions) or None),
        "/metrics",
    )


def _delta(before: Mapping[str, float], after: Mapping[str, float], metric: str) -> int:
    diff = after[metric] - before[metric]
    if diff < 0:
        raise TelemetryError(f"/metrics: {metric} went down during the pass (a restart?)")
    return _count(round(diff), f"/metrics {metric} delta")


def add(a: Drafting, b: Drafting) -> Drafting:
    """Two passes' drafting summed (counts a pass did not report stay None where both lack them)."""

    def plus(x: int | None, y: int | None) -> int | None:
        return None if x is None and y is None else (x or 0) + (y or 0)

    positions = None
    if a.positions is not None or b.positions is not None:
        pa, pb = a.positions or (), b.positions or ()
        positions = tuple(plus(x, y) or 0 for x, y in itertools.zip_longest(pa, pb))
    return Drafting(
        plus(a.drafted, b.drafted), plus(a.accepted, b.accepted), plus(a.steps, b.steps), plus(a.tokens, b.tokens),
        plus(a.drafts, b.drafts), positions,
    )  # fmt: skip


# -----------------------------------------------------------------------------------------------
# Acceptance of a pass, with a 95% interval


@dataclass(frozen=True)
class Rate:
    rate: float | None  # accepted / drafted
    low: float | None
    high: float | None
    mean_length: float | None  # tokens per verify step
    drafted: int
    accepted: int
    requests: int  # requests with telemetry (0: one aggregate from /metrics)
    length_low: float | None = None  # the mean length's 95% interval (per-request spread)
    length_high: float | None = None


def wilson(successes: int, n: int) -> tuple[float, float]:
    """Wilson score 95% interval of a binomial proportion."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def per_request_rate(items: Iterable[Drafting]) -> Rate | None:
    """Acceptance over requests: the ratio sum(accepted) / sum(drafted), with an interval from
    the requests' spread (a ratio estimator's delta-method variance; tokens of one request are not
    independent, requests are), or Wilson's over the drafted tokens when it is wider (few requests)."""
    items = list(items)
    rows = [d for d in items if d.drafted is not None and d.accepted is not None]
    length_rows = [d for d in items if d.steps]
    drafted = sum(d.drafted for d in rows)  # type: ignore[misc]
    accepted = sum(d.accepted for d in rows)  # type: ignore[misc]
    mean_length, length_low, length_high = _mean_length(length_rows)
    if drafted == 0:
        if not rows and mean_length is None:
            return None
        return Rate(None, None, None, mean_length, 0, 0, len(length_rows), length_low, length_high)
    rate = accepted / drafted
    n = len(rows)
    low, high = wilson(accepted, drafted)
    if n > 1:
        resid = sum((d.accepted - rate * d.drafted) ** 2 for d in rows)  # type: ignore[operator]
        se = math.sqrt(n / (n - 1) * resid) / drafted
        low, high = min(low, max(0.0, rate - Z95 * se)), max(high, min(1.0, rate + Z95 * se))
    return Rate(rate, low, high, mean_length, drafted, accepted, n, length_low, length_high)


def aggregate_rate(d: Drafting) -> Rate:
    """Acceptance of a whole pass from counter deltas: Wilson over the draft rounds where the
    server counts them (tokens of one round are not independent), else over drafted tokens."""
    drafted, accepted = d.drafted or 0, d.accepted or 0
    if drafted == 0:
        return Rate(None, None, None, None, 0, 0, 0)
    rate = accepted / drafted
    n = d.drafts if d.drafts else drafted
    low, high = wilson(round(rate * n), n)
    length = 1 + accepted / d.drafts if d.drafts else None
    return Rate(rate, low, high, length, drafted, accepted, 0)


def _mean_length(rows: list[Drafting]) -> tuple[float | None, float | None, float | None]:
    """Tokens per verify step over requests (a ratio), with its delta-method 95% interval."""
    pairs = [(d.tokens if d.tokens is not None else (d.accepted or 0) + (d.steps or 0), d.steps or 0) for d in rows]
    steps = sum(s for _, s in pairs)
    if steps == 0:
        return None, None, None
    length = sum(t for t, _ in pairs) / steps
    n = len(pairs)
    if n < 2:
        return length, None, None
    se = math.sqrt(n / (n - 1) * sum((t - length * s) ** 2 for t, s in pairs)) / steps
    return length, length - Z95 * se, length + Z95 * se


def collapsed(level1: Rate | None, level: Rate | None) -> bool:
    """Acceptance at `level` clearly below level 1's: intervals apart and a drop of COLLAPSE_DROP
    in the rate, or (no drafted counts) of COLLAPSE_LENGTH_DROP in the mean acceptance length."""
    if level1 is None or level is None:
        return False
    if level1.rate is not None and level.rate is not None:
        assert level1.low is not None and level.high is not None
        return level.high < level1.low and level1.rate - level.rate >= COLLAPSE_DROP
    if None in (level1.mean_length, level.mean_length, level1.length_low, level.length_high):
        return False
    return (
        level.length_high < level1.length_low  # type: ignore[operator]
        and level1.mean_length - level.mean_length >= COLLAPSE_LENGTH_DROP  # type: ignore[operator]
    )
