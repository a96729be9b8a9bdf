"""What a bench measured: one `Sample` per timed decode, one `Cell` per (arm, batch size, draft length),
the tracing on/off pairs, the whole `BenchResult` with its JSON form, and the goals it is judged by.

Pure records and arithmetic: no model, no clock, no file.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from specviz.bench.settings import BenchSettings, Job, jobs_for_batch

FORMAT_VERSION = 1
GOAL_ALIGNMENT_SHARE = 0.05
GOAL_TRACING_OVERHEAD = 0.05
GOAL_GROUP_SHARE = 0.5
GOAL_INPLACE_ALIGNMENT_SHARE = 0.01  # issue 14: zero-copy ragged decoding aligns in under 1% of a step
GOAL_WATCH_OVERHEAD = 0.10  # issue 10: a watched run at most 10% slower than the same run unwatched

SampleKey = tuple[str, int, int]  # Job.key: (arm, batch size, draft length)


@dataclass
class Sample:
    """What one timed run measured."""

    seconds: float
    tokens: int
    phases_ms: dict[str, float]  # draft, verify, align, bookkeeping, total (summed over steps)
    steps: int
    rows: int  # batch rows summed over steps
    grouped_steps: int
    full_group_steps: int  # grouped and as wide as the batch size
    divergences: list[int | None]  # first divergent token per prompt (None: exact)
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    verdict: str | None = None  # the checker's run verdict (first repeat only)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def exact_match(self) -> float:
        return sum(d is None for d in self.divergences) / len(self.divergences) if self.divergences else 1.0


@dataclass
class TracingResult:
    """Decode wall time with the recorder on vs off (NullRecorder), same config, interleaved."""

    arm: str
    batch_size: int
    draft_k: int
    seconds_off: list[float]
    seconds_on: list[float]
    # Per recorder-on run: the seconds it spent tracing (engine-timed: `record_step` and the KV
    # check, `header.options["tracing_seconds"]`). Empty where not measured (watch, old results).
    tracing_seconds_on: list[float] = field(default_factory=list)

    @property
    def overhead_inside(self) -> float | None:
        """Median over the recorder-on runs of tracing time / the rest of the run's decode time.

        The same cost as `overhead`, timed inside each run: run-to-run noise on a small machine
        (often +-20% between identical runs) does not enter it, so it resolves a few percent."""
        shares = [t / (on - t) for t, on in zip(self.tracing_seconds_on, self.seconds_on) if on > t]
        return median(shares) if shares else None

    @property
    def overhead(self) -> float:
        """Median over repeats of on/off - 1: the extra wall time tracing costs."""
        ratios = [on / off for on, off in zip(self.seconds_on, self.seconds_off) if off > 0]
        return median(ratios) - 1.0 if ratios else 0.0

    @property
    def overhead_of_fastest(self) -> float:
        """Fastest on / fastest off - 1: on a busy machine noise only adds time, so minima are steadier."""
        if not self.seconds_on or not min(self.seconds_off, default=0.0):
            return 0.0
        return min(self.seconds_on) / min(self.seconds_off) - 1.0


@dataclass
class Cell:
    """One (arm, batch size, draft length): medians over repeats."""

    arm: str
    method: str
    policy: str | None
    fault: str | None
    per_row_loop: bool
    batch_size: int
    draft_k: int
    repeats: int
    exact_match: float
    diverged: int
    first_divergence_min: int | None
    first_divergence_median: float | None
    verdict: str | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    tokens_per_second: float
    speedup_vs_baseline: float
    draft_share: float
    verify_share: float
    alignment_share: float
    bookkeeping_share: float
    step_ms: float
    draft_ms_per_step: float
    verify_ms_per_step: float
    align_ms_per_step: float
    bookkeeping_ms_per_step: float
    steps: int
    rows_per_step: float
    group_share: float | None
    full_group_share: float | None
    first_divergence: list[int | None] = field(default_factory=list)

    def brief(self) -> dict[str, Any]:
        """The per-method, per-batch-size entry of the JSON `results`."""
        out = asdict(self)
        for name in ("arm", "batch_size", "first_divergence"):
            out.pop(name)
        return out


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _share(samples: list[Sample], phase: str) -> float:
    return median([s.phases_ms[phase] / s.phases_ms["total"] if s.phases_ms["total"] > 0 else 0.0 for s in samples])


def _per_step(samples: list[Sample], phase: str) -> float:
    return median([s.phases_ms[phase] / s.steps for s in samples if s.steps])


def make_cell(job: Job, samples: list[Sample], baselines: list[Sample]) -> Cell:
    """Summarise one job's repeats; `baselines[i]` ran in the same repeat as `samples[i]`."""
    # Exactness from the least exact repeat: repeats agree on CPU, on a GPU they may not.
    worst = min(samples, key=lambda s: s.exact_match)
    diverged = [d for d in worst.divergences if d is not None]
    first = samples[0]  # counts that do not vary between repeats, and the one checked repeat
    steps = first.steps
    # Speedup as the median of same-repeat ratios, so drift of the machine between repeats cancels.
    ratios = [s.tokens_per_second / b.tokens_per_second for s, b in zip(samples, baselines) if b.tokens_per_second]
    is_exspec = job.arm.method == "exspec"
    return Cell(
        arm=job.arm.name,
        method=job.arm.method,
        policy=job.arm.policy,
        fault=job.arm.fault,
        per_row_loop=job.arm.per_row_loop,
        batch_size=job.batch_size,
        draft_k=job.draft_k,
        repeats=len(samples),
        exact_match=worst.exact_match,
        diverged=len(diverged),
        first_divergence_min=min(diverged) if diverged else None,
        first_divergence_median=float(statistics.median(diverged)) if diverged else None,
        verdict=first.verdict,
        acceptance_rate=first.acceptance_rate,
        mean_acceptance_length=first.mean_acceptance_length,
        tokens_per_second=median([s.tokens_per_second for s in samples]),
        speedup_vs_baseline=median(ratios),
        draft_share=_share(samples, "draft"),
        verify_share=_share(samples, "verify"),
        alignment_share=_share(samples, "align"),
        bookkeeping_share=_share(samples, "bookkeeping"),
        step_ms=_per_step(samples, "total"),
        draft_ms_per_step=_per_step(samples, "draft"),
        verify_ms_per_step=_per_step(samples, "verify"),
        align_ms_per_step=_per_step(samples, "align"),
        bookkeeping_ms_per_step=_per_step(samples, "bookkeeping"),
        steps=steps,
        rows_per_step=first.rows / steps if steps else 0.0,
        group_share=first.grouped_steps / steps if is_exspec and steps else None,
        full_group_share=first.full_group_steps / steps if is_exspec and steps else None,
        first_divergence=worst.divergences,
    )


def make_cells(settings: BenchSettings, samples: dict[SampleKey, list[Sample]]) -> list[Cell]:
    """Every cell of the grid, in the order of the settings (batch size, then draft length, then arm)."""
    cells = []
    for batch_size in settings.batch_sizes:
        baselines = samples[("baseline", batch_size, 0)]
        for job in jobs_for_batch(settings, batch_size):
            cells.append(make_cell(job, samples[job.key], baselines))
    return cells


@dataclass
class BenchResult:
    command: str
    started_at: str
    finished_at: str
    machine: dict[str, Any]
    settings: BenchSettings
    prompts: dict[str, Any]
    cells: list[Cell]
    tracing: TracingResult | None
    watch: TracingResult | None = None  # the eqspec-watched arm vs the same run unwatched ("on" = watched)
    tracing_by_arm: dict[str, TracingResult] = field(default_factory=dict)  # `tracing` is the eqspec one

    @property
    def timing(self) -> dict[str, Any]:
        """How the timed runs were taken: warm (after an untimed pass), interleaved, which repeats count."""
        cuda = self.settings.cuda
        return {
            "warm": True,  # CPU: one small untimed run per arm first; CUDA: a whole untimed repeat
            "warm_up": "first repeat over every shape, dropped" if cuda else "one small run per arm",
            "timed_repeats": len(self.settings.timed_repeats),
            "interleaved": True,
        }

    def cell(self, arm: str, batch_size: int, draft_k: int | None = None) -> Cell | None:
        """The cell of `arm` at `batch_size` and `draft_k` (default: the primary one; the baseline has 0)."""
        k = 0 if arm == "baseline" else (draft_k if draft_k is not None else self.settings.primary_k)
        for c in self.cells:
            if (c.arm, c.batch_size, c.draft_k) == (arm, batch_size, k):
                return c
        return None

    @property
    def grouping_batch(self) -> int:
        return self.settings.grouping_batch

    @property
    def grouping_window(self) -> int:
        return self.settings.grouping_window

    def group_shares(self) -> dict[str, float | None]:
        """Group share of every EXSPEC arm at batch 8 (or the closest measured) and the primary k."""
        out = {}
        for name in self.settings.arms:
            cell = self.cell(name, self.grouping_batch)
            if cell is not None and cell.method == "exspec" and cell.fault is None:
                out[name] = cell.group_share
        return out

    def goals(self) -> dict[str, Any]:
        return evaluate_goals(self)

    def results_table(self) -> dict[str, dict[str, dict[str, Any]]]:
        """results[arm][batch size] at the primary draft length (the baseline has k = 0)."""
        table: dict[str, dict[str, dict[str, Any]]] = {}
        for c in self.cells:
            if c.draft_k in (0, self.settings.primary_k):
                table.setdefault(c.arm, {})[str(c.batch_size)] = c.brief()
        return table

    def tracing_details(self) -> dict[str, Any] | None:
        return _paired_details(self.tracing)

    def to_json(self) -> dict[str, Any]:
        shares = self.group_shares()
        return {
            "format": "specviz-bench",
            "version": FORMAT_VERSION,
            "command": self.command,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "machine": self.machine,
            "settings": asdict(self.settings),
            "prompts": self.prompts,
            "draft_k": self.settings.primary_k,
            "results": self.results_table(),
            "timing": self.timing,
            "tracing_overhead": self.tracing.overhead if self.tracing else None,
            "tracing": self.tracing_details(),
            "tracing_overhead_by_arm": {name: t.overhead for name, t in self.tracing_by_arm.items()},
            "tracing_by_arm": {name: _paired_details(t) for name, t in self.tracing_by_arm.items()},
            "watch_overhead": self.watch.overhead if self.watch else None,
            "watch": _paired_details(self.watch),
            "exspec_group_share": shares.get("exspec"),
            "exspec_group_share_by_arm": shares,
            "exspec_grouping": {"batch_size": self.grouping_batch, "window": self.grouping_window},
            "goals": self.goals(),
            "cells": [asdict(c) for c in self.cells],
        }


def _paired_details(t: TracingResult | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {
        **asdict(t),
        "overhead": t.overhead,
        "overhead_of_fastest": t.overhead_of_fastest,
        "overhead_inside": t.overhead_inside,
    }


def evaluate_goals(result: BenchResult) -> dict[str, Any]:
    """Issue 5's goals, as measured in this run (None: not measured)."""
    largest = max(result.settings.batch_sizes)
    eq = result.cell("eqspec", largest)
    ex = result.cell("exspec", result.grouping_batch)
    eq_group = result.cell("eqspec", result.grouping_batch)
    watch = result.watch.overhead if result.watch else None
    align = eq.alignment_share if eq else None
    return {
        "alignment_share_batched_move": {
            "batch_size": largest,
            "value": align,
            "goal": f"< {GOAL_ALIGNMENT_SHARE}",
            "met": None if align is None else align < GOAL_ALIGNMENT_SHARE,
        },
        "tracing_overhead": _tracing_goal(result.tracing),
        "exspec_grouping": {**_grouping_goal(ex, eq_group), "num_prompts": result.prompts["count"]},
        "inplace_alignment_share": _inplace_goal(result.cell("inplace", largest)),
        "exspec_alignment_vs_eqspec": _exspec_align_goal(result.cell("exspec", largest), eq),
        "tracing_overhead_by_arm": {name: _tracing_goal(t) for name, t in result.tracing_by_arm.items()},
        "watch_overhead": {
            "value": watch,
            "goal": f"<= {GOAL_WATCH_OVERHEAD}",
            "met": None if watch is None else watch <= GOAL_WATCH_OVERHEAD,
        },
    }


def _tracing_goal(t: TracingResult | None) -> dict[str, Any]:
    """Judged on the overhead timed inside the runs where measured, else on the interleaved one."""
    inside = None if t is None else t.overhead_inside
    value = inside if inside is not None else (None if t is None else t.overhead)
    return {
        "value": value,
        "interleaved": None if t is None else t.overhead,
        "measured": None if t is None else ("inside the runs" if inside is not None else "interleaved"),
        "goal": f"< {GOAL_TRACING_OVERHEAD}",
        "met": None if value is None else value < GOAL_TRACING_OVERHEAD,
    }


def _inplace_goal(cell: Cell | None) -> dict[str, Any]:
    if cell is None:
        return {"met": None}
    return {
        "batch_size": cell.batch_size,
        "value": cell.alignment_share,
        "goal": f"< {GOAL_INPLACE_ALIGNMENT_SHARE}",
        "met": cell.alignment_share < GOAL_INPLACE_ALIGNMENT_SHARE,
    }


def _exspec_align_goal(ex: Cell | None, eq: Cell | None) -> dict[str, Any]:
    """Issue 14: with the persistent pool, EXSPEC's alignment per step is no higher than EQSPEC's."""
    if ex is None or eq is None:
        return {"met": None}
    return {
        "batch_size": ex.batch_size,
        "exspec_align_ms_per_step": ex.align_ms_per_step,
        "eqspec_align_ms_per_step": eq.align_ms_per_step,
        "goal": "exspec <= eqspec",
        "met": ex.align_ms_per_step <= eq.align_ms_per_step,
    }


def _grouping_goal(ex: Cell | None, eq: Cell | None) -> dict[str, Any]:
    if ex is None or eq is None:
        return {"met": None}
    share_ok = ex.group_share is not None and ex.group_share >= GOAL_GROUP_SHARE
    return {
        "batch_size": ex.batch_size,
        "group_share": ex.group_share,
        "exspec_tokens_per_second": ex.tokens_per_second,
        "eqspec_tokens_per_second": eq.tokens_per_second,
        "exact_match": ex.exact_match,
        "goal": f"group share >= {GOAL_GROUP_SHARE}, tokens/s >= eqspec, exact",
        "met": share_ok and ex.tokens_per_second >= eq.tokens_per_second and ex.exact_match == 1.0,
    }
