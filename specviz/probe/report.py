"""The probe's report: typed dataclasses and the versioned JSON file they write.

pandas-free and torch-free, for the app. Reading an untrusted file is `report_read` (size limits,
one-line errors naming the field), the JSON Schema `report_schema`; `position_kind` says what each
answer position of a prompt is, as the divergence map draws it. Format: docs/probe.md,
docs/probe.schema.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specviz.errors import SpecvizError

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
# position_kind codes: what an answer position is on the divergence map
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


def position_kind(p: PromptResult, j: int) -> int:
    """Answer position `j` of prompt `p`: SHARED before the first divergence, DIVERGED at it,
    AFTER past it on either side's answer, PAST_END beyond both answers.

    E.g. lengths 5 and 4, divergence 3: positions 0..5 -> [0, 0, 0, 1, 2, -1].
    """
    end = max(p.length_a, p.length_b)
    d = p.divergence if p.divergence is not None else end
    return PAST_END if j >= end else SHARED if j < d else DIVERGED if j == d else AFTER
