"""`python -m specviz bench`: exactness and cost of batched speculative decoding, side by side.

One command decodes the same prompts with a matrix of *arms* (batched greedy baseline, EQSPEC with
the batched KV move, EQSPEC with the reference's per-row loop, EXSPEC under two grouping policies,
optionally faulty engines) x batch sizes x draft lengths, and reports per cell:
- exactness against the batch-1 greedy oracle, decoded once per prompt set and reused by every cell;
- acceptance (DESIGN.md s4, via `specviz.analysis.metrics`);
- tokens/s, and the speedup against the batched baseline of the *same repeat*: within a repeat the
  arms of one batch size run back to back (their order rotated between repeats), and the speedup
  is the median over repeats of the per-repeat ratio, so machine drift cancels;
- the per-step time split into draft, verify, alignment (realignment, grouping, cache moves) and
  the rest (bookkeeping).
Two paired measurements ride along: tracing on vs off (interleaved), and EXSPEC group share.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from specviz.engine.exspec import POLICIES
from specviz.engine.faults import FAULTS
from specviz.engine.models import ModelPair
from specviz.engine.reference import greedy_reference
from specviz.engine.run import RunConfig, run
from specviz.errors import SpecvizError
from specviz.trace.naming import now_iso
from specviz.trace.schema import Trace

FORMAT_VERSION = 1
EXSPEC_POLICY = "converge"  # the policy of the `exspec` arm; other policies get `exspec-<policy>`
GOAL_ALIGNMENT_SHARE = 0.05
GOAL_TRACING_OVERHEAD = 0.05
GOAL_GROUP_SHARE = 0.5
GROUPING_BATCH = 8  # the paper's setting for group share: batch 8, window 6 x 8 = 48

Tick = Callable[[str], None]

# ---------------------------------------------------------------------------------------- arms


@dataclass(frozen=True)
class Arm:
    """One way of decoding: a method plus the knobs the benchmark varies."""

    name: str
    method: str
    per_row_loop: bool = False  # EQSPEC realignment with the reference's per-row Python loop
    policy: str | None = None  # EXSPEC grouping policy
    fault: str | None = None

    def config(self, batch_size: int, draft_k: int, settings: BenchSettings, record_steps: bool = True) -> RunConfig:
        return RunConfig(
            method=self.method,
            fault=self.fault,
            batch_size=batch_size,
            draft_k=max(draft_k, 1),
            max_new_tokens=settings.max_new_tokens,
            seed=settings.seed,
            exspec_window=settings.window_factor * batch_size,
            exspec_policy=self.policy or EXSPEC_POLICY,
            reference=False,  # the oracle is decoded once per prompt set (PromptSet.references)
            record_steps=record_steps,
            per_row_loop_move=self.per_row_loop,
        )


ARMS: dict[str, Arm] = {
    "baseline": Arm("baseline", "baseline"),
    "eqspec": Arm("eqspec", "eqspec"),
    "eqspec-loop": Arm("eqspec-loop", "eqspec", per_row_loop=True),
    "exspec": Arm("exspec", "exspec", policy=EXSPEC_POLICY),
    **{f"exspec-{p}": Arm(f"exspec-{p}", "exspec", policy=p) for p in POLICIES if p != EXSPEC_POLICY},
}


def resolve_arm(name: str) -> Arm:
    """A named arm, or `METHOD+FAULT` (e.g. `eqspec+stale-kv`) for a faulty engine."""
    if name in ARMS:
        return ARMS[name]
    method, plus, fault = name.partition("+")
    if plus and method in ("eqspec", "exspec") and fault in FAULTS:
        return Arm(name, method, fault=fault)
    known = ", ".join(ARMS)
    raise SpecvizError(f"unknown bench arm {name!r}; choose from {known}, or METHOD+FAULT (e.g. eqspec+stale-kv)")


# ------------------------------------------------------------------------------------ settings


@dataclass
class BenchSettings:
    arms: tuple[str, ...] = ("baseline", "eqspec", "eqspec-loop", "exspec", "exspec-reference")
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    draft_ks: tuple[int, ...] = (4, 2, 8)  # the first is the one `results` in the JSON reports
    num_prompts: int = 96
    max_new_tokens: int = 64
    repeats: int = 3
    tracing_repeats: int = 5
    window_factor: int = 6  # EXSPEC window = factor x batch size (the paper: 48 at batch 8)
    split: str = "all"
    seed: int = 0
    check: bool = True  # run the invariant checker on each cell's first repeat (verdicts)

    def validate(self) -> None:
        for name in self.arms:
            resolve_arm(name)
        if "baseline" not in self.arms:
            raise SpecvizError("the bench arms must include 'baseline': speedups are measured against it")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise SpecvizError("batch sizes must be positive")
        if not self.draft_ks or not all(1 <= k <= 64 for k in self.draft_ks):
            raise SpecvizError("draft lengths must be between 1 and 64")
        if self.num_prompts < 1 or self.max_new_tokens < 1 or self.repeats < 1 or self.tracing_repeats < 0:
            raise SpecvizError("--num-prompts, --max-new-tokens and --repeats must be at least 1")
        if self.window_factor < 1:
            raise SpecvizError("--window-factor must be at least 1")

    @property
    def primary_k(self) -> int:
        return self.draft_ks[0]


QUICK = BenchSettings(
    arms=("baseline", "eqspec", "eqspec-loop", "exspec"),
    batch_sizes=(1, 8, 32),
    draft_ks=(4,),
    num_prompts=32,
    max_new_tokens=16,
    repeats=2,
    tracing_repeats=3,
)


# ------------------------------------------------------------------------------------- prompts


@dataclass
class PromptSet:
    texts: list[str]
    ids: list[list[int]]
    skipped: int  # prompts left out because prompt + max_new_tokens exceeds the target's positions
    references: list[tuple[list[int], list[float]]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        lengths = [len(i) for i in self.ids]
        return {
            "count": len(self.ids),
            "skipped_too_long": self.skipped,
            "prompt_tokens_mean": round(statistics.fmean(lengths), 1),
            "prompt_tokens_max": max(lengths),
        }


def select_prompts(pair: ModelPair, texts: list[str], count: int, max_new_tokens: int) -> PromptSet:
    """`count` prompts spread evenly over `texts` (SpecBench is ordered by category)."""
    limit = getattr(pair.target.config, "max_position_embeddings", None)
    fitting: list[tuple[str, list[int]]] = []
    for text in texts:
        ids = list(pair.tokenizer(text)["input_ids"])
        if ids and (limit is None or len(ids) + max_new_tokens <= limit):
            fitting.append((text, ids))
    if not fitting:
        raise SpecvizError("no prompt fits the target's positions with this --max-new-tokens")
    count = min(count, len(fitting))
    picked = [fitting[i * len(fitting) // count] for i in range(count)]
    return PromptSet([t for t, _ in picked], [ids for _, ids in picked], len(texts) - len(fitting))


def decode_references(pair: ModelPair, prompts: PromptSet, max_new_tokens: int, tick: Tick | None = None) -> None:
    """The batch-1 greedy oracle, once per prompt set; every cell compares against it."""
    eos = frozenset(pair.eos_token_ids)
    prompts.references = []
    for ids in prompts.ids:
        prompts.references.append(greedy_reference(pair.target, ids, max_new_tokens, eos, pair.device))
        if tick is not None:
            tick("reference")


def attach_references(trace: Trace, prompts: PromptSet) -> None:
    for seq in trace.sequences:
        seq.reference_ids, seq.reference_margins = prompts.references[seq.seq_id]


# ------------------------------------------------------------------------------------- samples


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


def measure(trace: Trace, prompts: PromptSet, check: bool = False) -> Sample:
    from specviz.analysis.metrics import acceptance, phase_times, sequence_divergence, tokens_emitted

    attach_references(trace, prompts)
    total, _ = acceptance(trace)
    times = phase_times(trace)
    batch = trace.header.batch_size
    grouped = [s for s in trace.steps if s.grouped]
    return Sample(
        seconds=float(trace.header.decode_seconds or 0.0),
        tokens=tokens_emitted(trace),
        phases_ms={
            "draft": times["draft_ms"],
            "verify": times["verify_ms"],
            "align": times["align_ms"],
            "bookkeeping": times["bookkeeping_ms"],
            "total": times["total_ms"],
        },
        steps=len(trace.steps),
        rows=sum(len(s.rows) for s in trace.steps),
        grouped_steps=len(grouped),
        full_group_steps=sum(len(s.rows) == batch for s in grouped),
        divergences=[sequence_divergence(s) for s in trace.sequences],
        acceptance_rate=total.rate,
        mean_acceptance_length=total.mean_length,
        verdict=_verdict(trace) if check else None,
    )


def _verdict(trace: Trace) -> str:
    from specviz.analysis.check import check_trace

    return check_trace(trace).verdict


def decode(
    pair: ModelPair,
    prompts: PromptSet,
    arm: Arm,
    batch_size: int,
    draft_k: int,
    settings: BenchSettings,
    record_steps: bool = True,
) -> Trace:
    return run(pair, prompts.texts, arm.config(batch_size, draft_k, settings, record_steps))


# -------------------------------------------------------------------------------------- matrix


@dataclass(frozen=True)
class Job:
    arm: Arm
    batch_size: int
    draft_k: int  # 0 for the baseline

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.arm.name, self.batch_size, self.draft_k)


def jobs_for_batch(settings: BenchSettings, batch_size: int) -> list[Job]:
    """One batch size's runs of one repeat: the baseline once, every other arm per draft length."""
    jobs = [Job(ARMS["baseline"], batch_size, 0)]
    for k in settings.draft_ks:
        jobs += [Job(resolve_arm(name), batch_size, k) for name in settings.arms if name != "baseline"]
    return jobs


def interleaved(jobs: list[Job], repeat: int) -> list[Job]:
    """Rotate the order each repeat, so no arm always runs first (warm caches) or last."""
    shift = repeat % len(jobs)
    return jobs[shift:] + jobs[:shift]


def run_matrix(
    pair: ModelPair, prompts: PromptSet, settings: BenchSettings, tick: Tick | None = None
) -> dict[tuple[str, int, int], list[Sample]]:
    samples: dict[tuple[str, int, int], list[Sample]] = {}
    for repeat in range(settings.repeats):
        for batch_size in settings.batch_sizes:
            for job in interleaved(jobs_for_batch(settings, batch_size), repeat):
                trace = decode(pair, prompts, job.arm, job.batch_size, job.draft_k, settings)
                check = settings.check and repeat == 0
                samples.setdefault(job.key, []).append(measure(trace, prompts, check))
                if tick is not None:
                    tick(f"{job.arm.name} b={job.batch_size} k={job.draft_k}")
    return samples


def warm_up(pair: ModelPair, prompts: PromptSet, settings: BenchSettings) -> None:
    """One small untimed run per arm: first-call allocations and lazy imports stay out of the timings."""
    small = PromptSet(prompts.texts[:2], prompts.ids[:2], 0)
    short = replace(settings, max_new_tokens=min(4, settings.max_new_tokens))
    for name in settings.arms:
        decode(pair, small, resolve_arm(name), 2, settings.primary_k, short)


# -------------------------------------------------------------------------------------- cells


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


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _share(samples: list[Sample], phase: str) -> float:
    return _median([s.phases_ms[phase] / s.phases_ms["total"] if s.phases_ms["total"] > 0 else 0.0 for s in samples])


def _per_step(samples: list[Sample], phase: str) -> float:
    return _median([s.phases_ms[phase] / s.steps for s in samples if s.steps])


def _divergence_stats(samples: list[Sample]) -> tuple[Sample, list[int]]:
    """The least exact repeat (repeats agree on CPU; on GPU they may not) and its divergences."""
    worst = min(samples, key=lambda s: s.exact_match)
    return worst, [d for d in worst.divergences if d is not None]


def make_cell(job: Job, samples: list[Sample], baselines: list[Sample]) -> Cell:
    worst, diverged = _divergence_stats(samples)
    steps = samples[0].steps
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
        verdict=samples[0].verdict,
        acceptance_rate=samples[0].acceptance_rate,
        mean_acceptance_length=samples[0].mean_acceptance_length,
        tokens_per_second=_median([s.tokens_per_second for s in samples]),
        speedup_vs_baseline=_median(ratios),
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
        rows_per_step=samples[0].rows / steps if steps else 0.0,
        group_share=samples[0].grouped_steps / steps if is_exspec and steps else None,
        full_group_share=samples[0].full_group_steps / steps if is_exspec and steps else None,
        first_divergence=worst.divergences,
    )


def make_cells(settings: BenchSettings, samples: dict[tuple[str, int, int], list[Sample]]) -> list[Cell]:
    cells = []
    for batch_size in settings.batch_sizes:
        baselines = samples[("baseline", batch_size, 0)]
        for job in jobs_for_batch(settings, batch_size):
            cells.append(make_cell(job, samples[job.key], baselines))
    return cells


# ------------------------------------------------------------------------------------- tracing


@dataclass
class TracingResult:
    """Decode wall time with the recorder on vs off (NullRecorder), same config, interleaved."""

    arm: str
    batch_size: int
    draft_k: int
    seconds_off: list[float]
    seconds_on: list[float]

    @property
    def overhead(self) -> float:
        """Median over repeats of on/off - 1: the extra wall time tracing costs."""
        ratios = [on / off for on, off in zip(self.seconds_on, self.seconds_off) if off > 0]
        return _median(ratios) - 1.0 if ratios else 0.0

    @property
    def overhead_of_fastest(self) -> float:
        """Fastest on / fastest off - 1: on a busy machine noise only adds time, so minima are steadier."""
        if not self.seconds_on or not min(self.seconds_off, default=0.0):
            return 0.0
        return min(self.seconds_on) / min(self.seconds_off) - 1.0


def measure_tracing(
    pair: ModelPair, prompts: PromptSet, settings: BenchSettings, tick: Tick | None = None
) -> TracingResult | None:
    if settings.tracing_repeats < 1:
        return None
    arm = ARMS["eqspec"]
    batch_size = _closest(settings.batch_sizes, GROUPING_BATCH)
    result = TracingResult(arm.name, batch_size, settings.primary_k, [], [])
    for repeat in range(settings.tracing_repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        for record_steps in order:
            trace = decode(pair, prompts, arm, batch_size, settings.primary_k, settings, record_steps)
            (result.seconds_on if record_steps else result.seconds_off).append(float(trace.header.decode_seconds))
            if tick is not None:
                tick(f"tracing {'on' if record_steps else 'off'}")
    return result


def _closest(values: tuple[int, ...], target: int) -> int:
    return min(values, key=lambda v: (abs(v - target), v))


# ------------------------------------------------------------------------------------- results


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

    def cell(self, arm: str, batch_size: int, draft_k: int | None = None) -> Cell | None:
        k = 0 if arm == "baseline" else (draft_k if draft_k is not None else self.settings.primary_k)
        for c in self.cells:
            if (c.arm, c.batch_size, c.draft_k) == (arm, batch_size, k):
                return c
        return None

    @property
    def grouping_batch(self) -> int:
        return _closest(self.settings.batch_sizes, GROUPING_BATCH)

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
            "tracing_overhead": self.tracing.overhead if self.tracing else None,
            "tracing": self.tracing_details(),
            "exspec_group_share": shares.get("exspec"),
            "exspec_group_share_by_arm": shares,
            "exspec_grouping": {"batch_size": self.grouping_batch, "window": self.grouping_window},
            "goals": self.goals(),
            "cells": [asdict(c) for c in self.cells],
        }

    def tracing_details(self) -> dict[str, Any] | None:
        if self.tracing is None:
            return None
        t = self.tracing
        return {**asdict(t), "overhead": t.overhead, "overhead_of_fastest": t.overhead_of_fastest}

    @property
    def grouping_window(self) -> int:
        return self.settings.window_factor * self.grouping_batch

    def results_table(self) -> dict[str, dict[str, dict[str, Any]]]:
        """results[arm][batch size] at the primary draft length (the baseline has k = 0)."""
        table: dict[str, dict[str, dict[str, Any]]] = {}
        for c in self.cells:
            if c.draft_k in (0, self.settings.primary_k):
                table.setdefault(c.arm, {})[str(c.batch_size)] = c.brief()
        return table


def evaluate_goals(result: BenchResult) -> dict[str, Any]:
    """Issue 5's goals, as measured in this run (None: not measured)."""
    largest = max(result.settings.batch_sizes)
    eq = result.cell("eqspec", largest)
    ex = result.cell("exspec", result.grouping_batch)
    eq_group = result.cell("eqspec", result.grouping_batch)
    overhead = result.tracing.overhead if result.tracing else None
    align = eq.alignment_share if eq else None
    return {
        "alignment_share_batched_move": {
            "batch_size": largest,
            "value": align,
            "goal": f"< {GOAL_ALIGNMENT_SHARE}",
            "met": None if align is None else align < GOAL_ALIGNMENT_SHARE,
        },
        "tracing_overhead": {
            "value": overhead,
            "goal": f"< {GOAL_TRACING_OVERHEAD}",
            "met": None if overhead is None else overhead < GOAL_TRACING_OVERHEAD,
        },
        "exspec_grouping": {**_grouping_goal(ex, eq_group), "num_prompts": result.prompts["count"]},
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


def machine_info(pair: ModelPair) -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(pair.device),
        "dtype": str(pair.dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target": pair.target_name,
        "draft": pair.draft_name,
        "load_average_start": _load_average(),
    }
    if pair.device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(pair.device)
    return info


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def provenance(command: str) -> str:
    """One markdown line for a results file: date, machine, threads, versions, command."""
    import transformers

    return (
        f"- {now_iso()}; {platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"load average {_load_average()}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"`{command}`"
    )


# ---------------------------------------------------------------------------------- entry point


def count_runs(settings: BenchSettings) -> int:
    per_batch = 1 + (len(settings.arms) - 1) * len(settings.draft_ks)
    return settings.repeats * len(settings.batch_sizes) * per_batch + 2 * settings.tracing_repeats


def run_bench(
    pair: ModelPair,
    texts: list[str],
    settings: BenchSettings,
    command: str = "",
    show_progress: bool = True,
) -> BenchResult:
    from tqdm import tqdm

    settings.validate()
    started = now_iso()
    machine = machine_info(pair)
    prompts = select_prompts(pair, texts, settings.num_prompts, settings.max_new_tokens)
    total = len(prompts.ids) + count_runs(settings)
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=not show_progress) as bar:

        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        decode_references(pair, prompts, settings.max_new_tokens, tick)
        warm_up(pair, prompts, settings)
        samples = run_matrix(pair, prompts, settings, tick)
        tracing = measure_tracing(pair, prompts, settings, tick)
    machine["load_average_end"] = _load_average()
    return BenchResult(
        command=command,
        started_at=started,
        finished_at=now_iso(),
        machine=machine,
        settings=settings,
        prompts=prompts.describe(),
        cells=make_cells(settings, samples),
        tracing=tracing,
    )


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small matrix, under 3 minutes on 2 CPU cores")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object on stdout")
    parser.add_argument("--out", default=None, help="output folder (default runs/bench-<time>)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--plotlyjs", choices=["inline", "cdn"], default="inline", help="plots.html: offline (4.8 MB) or CDN (small)"
    )
    parser.add_argument("--arms", type=_name_list, default=None, help=f"comma list from {', '.join(ARMS)}")
    parser.add_argument("--faults", type=_name_list, default=None, help="add eqspec+FAULT arms ('all' for every)")
    parser.add_argument("--batch-sizes", type=_int_list, default=None, help="e.g. 1,2,4,8,16,32")
    parser.add_argument("--draft-ks", type=_int_list, default=None, help="e.g. 4,2,8 (the first is the headline)")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--tracing-repeats", type=int, default=None, help="0 skips the tracing measurement")
    parser.add_argument("--window-factor", type=int, default=None, help="EXSPEC window = factor x batch size")
    parser.add_argument("--split", choices=["all", "heldout", "train"], default=None, help="SpecBench split")
    parser.add_argument("--no-check", action="store_true", help="skip the invariant checker's verdicts")
    parser.add_argument("--target", default=None, help="target model (default: embedded)")
    parser.add_argument("--draft", default=None, help="draft model (default: embedded)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--seed", type=int, default=None)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    base = QUICK if args.quick else BenchSettings()
    overrides = {
        name: getattr(args, name)
        for name in (
            "arms",
            "batch_sizes",
            "draft_ks",
            "num_prompts",
            "max_new_tokens",
            "repeats",
            "tracing_repeats",
            "window_factor",
            "split",
            "seed",
        )
        if getattr(args, name, None) is not None
    }
    settings = replace(base, **overrides)
    if args.faults:
        faults = sorted(FAULTS) if args.faults == ("all",) else list(args.faults)
        settings.arms = settings.arms + tuple(f"eqspec+{f}" for f in faults if f"eqspec+{f}" not in settings.arms)
    if args.no_check:
        settings.check = False
    settings.validate()
    return settings


def command_line(args: argparse.Namespace) -> str:
    """The bench command as run, rebuilt from the parsed options (for the results' provenance)."""
    parts = ["python -m specviz bench"]
    for name, value in sorted(vars(args).items()):
        if name in ("command", "func") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, tuple):
            parts.append(f"{flag} {','.join(str(v) for v in value)}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def warn_if_busy(device: torch.device) -> None:
    """CPU timings on a machine busy with other work are noise: say so before spending the time."""
    load = _load_average()
    cores = os.cpu_count() or 1
    if device.type == "cpu" and load is not None and load[0] > 0.5 * cores:
        print(
            f"specviz: warning: load average {load[0]:.1f} on {cores} cores before the bench; "
            "timings (tokens/s, shares, speedups) will be noisy. Exactness is unaffected.",
            file=sys.stderr,
        )


def run_from_args(args: argparse.Namespace) -> int:
    from specviz.data import load_specbench
    from specviz.engine.models import load_pair

    settings = settings_from_args(args)
    if args.threads is not None:
        if args.threads < 1:
            raise SpecvizError("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else Path("runs") / f"bench-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    warn_if_busy(pair.device)
    try:
        result = run_bench(pair, load_specbench(settings.split), settings, command_line(args))
    except KeyboardInterrupt:
        print("specviz: bench interrupted; nothing written", file=sys.stderr)
        return 130
    paths = write_outputs(result, out, args.plotlyjs)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(render_markdown(result))
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------ rendering

# (header, Cell field, format) for the markdown table; shares print as percentages.
TABLE = (
    ("arm", "arm", "{}"),
    ("batch", "batch_size", "{}"),
    ("k", "draft_k", "{}"),
    ("exact", "exact_match", "{:.3f}"),
    ("diverged", "diverged", "{}"),
    ("first div min/med", None, ""),
    ("verdict", "verdict", "{}"),
    ("acc rate", "acceptance_rate", "{:.3f}"),
    ("mean acc len", "mean_acceptance_length", "{:.2f}"),
    ("tok/s", "tokens_per_second", "{:.1f}"),
    ("speedup", "speedup_vs_baseline", "{:.2f}x"),
    ("draft %", "draft_share", "{:.1%}"),
    ("verify %", "verify_share", "{:.1%}"),
    ("align %", "alignment_share", "{:.1%}"),
    ("bookkeeping %", "bookkeeping_share", "{:.1%}"),
    ("step ms", "step_ms", "{:.2f}"),
    ("rows/step", "rows_per_step", "{:.2f}"),
    ("group share", "group_share", "{:.1%}"),
    ("full groups", "full_group_share", "{:.1%}"),
)


def _format_cell(cell: Cell, name: str | None, pattern: str) -> str:
    if name is None:
        if cell.first_divergence_min is None:
            return "-"
        return f"{cell.first_divergence_min}/{cell.first_divergence_median:g}"
    value = getattr(cell, name)
    return "-" if value is None else pattern.format(value)


def markdown_table(cells: list[Cell]) -> str:
    lines = ["| " + " | ".join(h for h, _, _ in TABLE) + " |", "|" + "---|" * len(TABLE)]
    for cell in cells:
        lines.append("| " + " | ".join(_format_cell(cell, n, p) for _, n, p in TABLE) + " |")
    return "\n".join(lines)


def _goal_lines(goals: dict[str, Any]) -> list[str]:
    def verdict(met: bool | None) -> str:
        return "not measured" if met is None else ("met" if met else "NOT met")

    align = goals["alignment_share_batched_move"]
    tracing = goals["tracing_overhead"]
    grouping = goals["exspec_grouping"]
    lines = [
        f"- alignment share, eqspec batched move at batch {align['batch_size']}: "
        f"{_pct(align['value'])} (goal {align['goal']}): {verdict(align['met'])}",
        f"- tracing overhead: {_pct(tracing['value'])} (goal {tracing['goal']}): {verdict(tracing['met'])}",
    ]
    if grouping.get("met") is not None:
        lines.append(
            f"- exspec at batch {grouping['batch_size']}: group share {_pct(grouping['group_share'])}, "
            f"{grouping['exspec_tokens_per_second']:.1f} tok/s vs eqspec {grouping['eqspec_tokens_per_second']:.1f}, "
            f"exact {grouping['exact_match']:.3f} ({grouping['goal']}): {verdict(grouping['met'])}; "
            f"on {grouping['num_prompts']} prompts (lengths converge only among many prompts: the issue's "
            "setting is all 480, benchmarks/exspec_grouping.py)"
        )
    return lines


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def render_markdown(result: BenchResult) -> str:
    s, m = result.settings, result.machine
    tracing = result.tracing
    lines = [
        "# specviz bench",
        "",
        f"- date: {result.started_at} to {result.finished_at}",
        f"- command: `{result.command}`",
        f"- machine: {m['processor']}, {m['cpu_count']} cores, torch threads {m['torch_threads']}, "
        f"device {m.get('device_name', m['device'])}, {m['dtype']}; torch {m['torch']}, transformers "
        f"{m['transformers']}; load average {m['load_average_start']} -> {m.get('load_average_end')}",
        f"- models: target {m['target']}, draft {m['draft']}",
        f"- prompts: {result.prompts['count']} SpecBench ({s.split}) prompts spread over the categories, "
        f"{result.prompts['prompt_tokens_mean']} tokens on average (max {result.prompts['prompt_tokens_max']}), "
        f"{result.prompts['skipped_too_long']} too long for the target left out; max new tokens {s.max_new_tokens}",
        f"- {s.repeats} repeats, arms interleaved; speedup = median over repeats of tok/s / baseline tok/s "
        f"(same batch size, same repeat); EXSPEC window = {s.window_factor} x batch; "
        f"exspec arm policy `{EXSPEC_POLICY}`",
        "",
        "## Results",
        "",
        markdown_table(result.cells),
        "",
        "## Tracing overhead",
        "",
    ]
    if tracing is not None:
        lines.append(
            f"{tracing.arm}, batch {tracing.batch_size}, k={tracing.draft_k}, {len(tracing.seconds_on)} interleaved "
            f"pairs: median on/off - 1 = {_pct(tracing.overhead)}, fastest on / fastest off - 1 = "
            f"{_pct(tracing.overhead_of_fastest)} (on {_seconds(tracing.seconds_on)}, "
            f"off {_seconds(tracing.seconds_off)})"
        )
    else:
        lines.append("not measured")
    shares = result.group_shares()
    lines += ["", f"## EXSPEC group share (batch {result.grouping_batch}, window {result.grouping_window})", ""]
    lines += [f"- {arm}: {_pct(share)}" for arm, share in shares.items()] or ["no exspec arm"]
    lines += ["", "## Goals", "", *_goal_lines(result.goals()), ""]
    return "\n".join(lines)


def _seconds(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "] s"


def write_csv(cells: list[Cell], path: Path) -> None:
    import csv

    names = _cell_fields()
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        for cell in cells:
            row = asdict(cell)
            writer.writerow({n: row[n] for n in names})


def _series(result: BenchResult, field_name: str, scale: float = 1.0) -> dict[str, tuple[list[int], list[float]]]:
    """Per arm at the primary draft length: (batch sizes, values)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for cell in result.cells:
        if cell.draft_k not in (0, result.settings.primary_k):
            continue
        xs, ys = out.setdefault(cell.arm, ([], []))
        xs.append(cell.batch_size)
        ys.append(getattr(cell, field_name) * scale)
    return out


def _line_figure(result: BenchResult, field_name: str, title: str, y_title: str, scale: float = 1.0) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for arm, (xs, ys) in _series(result, field_name, scale).items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=arm))
    fig.update_xaxes(type="log", tickvals=list(result.settings.batch_sizes), title="batch size")
    fig.update_layout(title=title, yaxis_title=y_title, template="plotly_white", height=420)
    return fig


def _phase_figure(result: BenchResult) -> Any:
    import plotly.graph_objects as go

    cells = [c for c in result.cells if c.draft_k in (0, result.settings.primary_k)]
    labels = [f"{c.arm} b{c.batch_size}" for c in cells]
    fig = go.Figure()
    for phase, name in (("draft", "draft"), ("verify", "verify"), ("alignment", "align"), ("bookkeeping", "other")):
        values = [getattr(c, f"{phase}_share") * 100 for c in cells]
        fig.add_trace(go.Bar(x=labels, y=values, name=name))
    fig.update_layout(
        barmode="stack", title="Step time split", yaxis_title="% of step time", template="plotly_white", height=480
    )
    return fig


def figures(result: BenchResult) -> dict[str, Any]:
    k = result.settings.primary_k
    alignment = _line_figure(
        result, "alignment_share", f"Alignment share of step time vs batch size (k={k})", "% of step time", 100
    )
    alignment.add_hline(y=GOAL_ALIGNMENT_SHARE * 100, line_dash="dash", annotation_text="5% goal")
    return {
        "alignment_share": alignment,
        "tokens_per_second": _line_figure(result, "tokens_per_second", f"Throughput (k={k})", "tokens/s"),
        "speedup": _line_figure(result, "speedup_vs_baseline", f"Speedup vs batched baseline (k={k})", "x baseline"),
        "phases": _phase_figure(result),
    }


def write_plots(result: BenchResult, out: Path, plotlyjs: str = "inline") -> list[Path]:
    """One HTML page (plotly.js inlined once, or loaded from its CDN); PNGs too when kaleido is installed."""
    figs = figures(result)
    first: bool | str = True if plotlyjs == "inline" else "cdn"
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=first if i == 0 else False, default_height=fig.layout.height)
        for i, fig in enumerate(figs.values())
    ]
    page = out / "plots.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>specviz bench</title></head><body>"
        + "".join(parts)
        + "</body></html>",
        encoding="utf-8",
    )
    paths = [page]
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return paths
    for name, fig in figs.items():
        png = out / f"{name}.png"
        fig.write_image(png)
        paths.append(png)
    return paths


def write_outputs(result: BenchResult, out: Path, plotlyjs: str = "inline") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, json_path = out / "results.csv", out / "results.md", out / "results.json"
    write_csv(result.cells, csv_path)
    md_path.write_text(render_markdown(result), encoding="utf-8")
    json_path.write_text(json.dumps(result.to_json(), indent=1), encoding="utf-8")
    return [csv_path, md_path, json_path, *write_plots(result, out, plotlyjs)]


def _cell_fields() -> list[str]:
    return [f.name for f in fields(Cell) if f.name != "first_divergence"]
