"""Running the arms: the prompts and their oracle, one timed decode per job, the tracing on/off pairs.

Every decode goes through the engine's own `run` (the same code path as `specviz record`), with the
batch-1 greedy oracle decoded once per prompt set and attached to each trace before it is measured.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from specviz.bench.machine import load_average, machine_info
from specviz.bench.results import BenchResult, Sample, SampleKey, TracingResult, make_cells
from specviz.bench.settings import (
    ARMS,
    CUDA_MIN_REPEATS,
    WATCH_ARM,
    Arm,
    BenchSettings,
    count_runs,
    interleaved,
    jobs_for_batch,
    resolve_arm,
)
from specviz.engine.clock import synchronize
from specviz.engine.models import ModelPair
from specviz.engine.run import RunConfig, fits_positions, greedy_references, prompt_token_ids, run
from specviz.errors import SpecvizError
from specviz.trace.naming import now_iso
from specviz.trace.schema import Trace

Tick = Callable[[str], None]  # advances the progress bar by one unit, with a label of what finished


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
    fitting: list[tuple[str, list[int]]] = []
    for text in texts:
        ids = prompt_token_ids(pair, text)
        if ids and fits_positions(pair, ids, max_new_tokens):
            fitting.append((text, ids))
    if not fitting:
        raise SpecvizError("no prompt fits the target's positions with this --max-new-tokens")
    count = min(count, len(fitting))
    picked = [fitting[i * len(fitting) // count] for i in range(count)]
    return PromptSet([t for t, _ in picked], [ids for _, ids in picked], len(texts) - len(fitting))


def decode(
    pair: ModelPair,
    prompts: PromptSet,
    arm: Arm,
    batch_size: int,
    draft_k: int,
    settings: BenchSettings,
    record_steps: bool = True,
) -> Trace:
    """One untouched engine run of `arm`; the trace carries its own wall time (`decode_seconds`).

    A watched arm returns the watch's trace instead, timed from the first model call to the last emit.
    """
    config = arm.config(batch_size, draft_k, settings, record_steps)
    if arm.watched:
        return run_watched(pair, prompts, config).trace
    return run(pair, prompts.texts, config)


@dataclass
class WatchedRun:
    """One run under `specviz.watch`: its trace, and the time of each part (seconds)."""

    trace: Trace
    decode_wall: float  # the engine's run under the hooks, `rows` and `emit`: what the decode costs
    decode_cpu: float
    close_wall: float  # `close(reference=False)`: step assembly, once after the decode
    close_cpu: float

    @property
    def wall(self) -> float:
        return self.decode_wall + self.close_wall


def run_watched(pair: ModelPair, prompts: PromptSet, config: RunConfig) -> WatchedRun:
    """The engine (its recorder off) under `specviz.watch`, instrumented as docs/watch.md says:
    `rows` before each step, `emit` after it; the decode and the watch's `close` (step assembly, no
    reference decode) timed apart."""
    import specviz.engine.run as run_module
    from specviz.watch import watch

    w = watch(pair.target, pair.draft, tokenizer=pair.tokenizer, prompts=prompts.ids, name="specviz (watched)")
    original = run_module.Engine

    class WatchedEngine(original):  # type: ignore[misc, valid-type]
        # A class is part of a reference cycle: a closure over `w` would keep the watch alive until
        # a full garbage collection, which the next run (of either arm) would pay for. So the
        # watch is a class attribute, cleared when the run ends.
        watch: Any = None

        def step(self, batch: Any) -> Any:
            self.watch.rows([s.seq_id for s in batch.seqs])
            before = [len(s.output_ids) for s in batch.seqs]
            outcome = super().step(batch)
            for seq, n in zip(batch.seqs, before):
                self.watch.emit(seq.seq_id, seq.output_ids[n:], seq.finish_reason)
            return outcome

    WatchedEngine.watch = w
    run_module.Engine = WatchedEngine
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        run_module.run(pair, prompts.texts, config)
        synchronize(pair.device)
        decoded_wall, decoded_cpu = time.perf_counter(), time.process_time()
        trace = w.close(reference=False)
        return WatchedRun(
            trace,
            decode_wall=decoded_wall - wall,
            decode_cpu=decoded_cpu - cpu,
            close_wall=time.perf_counter() - decoded_wall,
            close_cpu=time.process_time() - decoded_cpu,
        )
    finally:
        run_module.Engine = original
        WatchedEngine.watch = None


def run_unwatched(pair: ModelPair, prompts: PromptSet, config: RunConfig) -> float:
    """The watched arm's twin: the same run, recorder off, no watch; wall seconds."""
    started = time.perf_counter()
    run(pair, prompts.texts, config)
    synchronize(pair.device)
    return time.perf_counter() - started


def sample_trace(trace: Trace, prompts: PromptSet, check: bool = False) -> Sample:
    """Measure one decoded trace against the prompt set's oracle; `check` adds the checker's verdict."""
    from specviz.analysis.exactness import sequence_divergence
    from specviz.analysis.metrics import acceptance, phase_times, tokens_emitted

    for seq in trace.sequences:
        seq.reference_ids, seq.reference_margins = prompts.references[seq.seq_id]
    total, _ = acceptance(trace)
    times = phase_times(trace)
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
        full_group_steps=sum(len(s.rows) == trace.header.batch_size for s in grouped),
        divergences=[sequence_divergence(s) for s in trace.sequences],
        acceptance_rate=total.rate,
        mean_acceptance_length=total.mean_length,
        verdict=_verdict(trace) if check else None,
    )


def _verdict(trace: Trace) -> str:
    from specviz.analysis.check import check_trace

    return check_trace(trace).verdict


def with_device(settings: BenchSettings, pair: ModelPair) -> BenchSettings:
    """On CUDA the first repeat is dropped (cold), so at least `CUDA_MIN_REPEATS` run."""
    if pair.device.type != "cuda":
        return settings
    if settings.repeats < CUDA_MIN_REPEATS:
        print(f"specviz: CUDA: {CUDA_MIN_REPEATS} repeats (the first, cold, is dropped)", file=sys.stderr)
    return replace(settings, cuda=True, repeats=max(settings.repeats, CUDA_MIN_REPEATS))


def warm_up(pair: ModelPair, prompts: PromptSet, settings: BenchSettings) -> None:
    """One small untimed run per arm: first-call allocations and lazy imports stay out of the timings."""
    small = PromptSet(prompts.texts[:2], prompts.ids[:2], 0)
    short = replace(settings, max_new_tokens=min(4, settings.max_new_tokens))
    for name in settings.arms:
        decode(pair, small, resolve_arm(name), 2, settings.primary_k, short)


def run_matrix(
    pair: ModelPair, prompts: PromptSet, settings: BenchSettings, tick: Tick | None = None
) -> dict[SampleKey, list[Sample]]:
    """Every job of every repeat; within a repeat, the arms of one batch size run back to back."""
    samples: dict[SampleKey, list[Sample]] = {}
    first_timed = settings.timed_repeats.start
    for repeat in range(settings.repeats):
        for batch_size in settings.batch_sizes:
            for job in interleaved(jobs_for_batch(settings, batch_size), repeat):
                trace = decode(pair, prompts, job.arm, job.batch_size, job.draft_k, settings)
                if repeat >= first_timed:  # on CUDA the first repeat warms every shape up, untimed
                    check = settings.check and repeat == first_timed  # verdicts do not change between repeats
                    samples.setdefault(job.key, []).append(sample_trace(trace, prompts, check))
                if tick is not None:
                    tick(f"{job.arm.name} b={job.batch_size} k={job.draft_k}")
    return samples


def measure_tracing(
    pair: ModelPair, prompts: PromptSet, settings: BenchSettings, tick: Tick | None = None
) -> dict[str, TracingResult]:
    """Each tracing arm (EQSPEC, INPLACE) at the grouping batch with the recorder on and off, after the
    warm-up; every repeat runs all arms' pairs back to back, on/off order alternating per repeat."""
    if settings.tracing_repeats < 1:
        return {}
    batch_size = settings.grouping_batch
    results = {
        name: TracingResult(name, batch_size, settings.primary_k, [], []) for name in settings.measured_tracing_arms
    }
    for repeat in range(settings.tracing_repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        for name, result in results.items():
            for record_steps in order:
                trace = decode(pair, prompts, ARMS[name], batch_size, settings.primary_k, settings, record_steps)
                seconds = float(trace.header.decode_seconds)
                (result.seconds_on if record_steps else result.seconds_off).append(seconds)
                if record_steps:
                    result.tracing_seconds_on.append(float(trace.header.options.get("tracing_seconds", 0.0)))
                if tick is not None:
                    tick(f"tracing {name} {'on' if record_steps else 'off'}")
    return results


def measure_watch(
    pair: ModelPair, prompts: PromptSet, settings: BenchSettings, tick: Tick | None = None
) -> TracingResult | None:
    """The eqspec-watched arm against the same run unwatched (both recorder off), at the grouping
    batch, in alternating order per repeat, after the warm-up: overhead is a ratio within one run."""
    if WATCH_ARM not in settings.arms or settings.tracing_repeats < 1:
        return None
    arm = ARMS[WATCH_ARM]
    batch_size = settings.grouping_batch
    config = arm.config(batch_size, settings.primary_k, settings)
    result = TracingResult(arm.name, batch_size, settings.primary_k, [], [])
    for repeat in range(settings.tracing_repeats):
        for watched in (False, True) if repeat % 2 == 0 else (True, False):
            # From a collected heap, untimed: else the run that crosses the threshold of a full
            # collection (hundreds of ms here) pays for the garbage of every run before it.
            gc.collect()
            if watched:
                result.seconds_on.append(run_watched(pair, prompts, config).wall)
            else:
                result.seconds_off.append(run_unwatched(pair, prompts, config))
            if tick is not None:
                tick(f"watch {'on' if watched else 'off'}")
    return result


def run_bench(
    pair: ModelPair,
    texts: list[str],
    settings: BenchSettings,
    command: str = "",
    show_progress: bool = True,
) -> BenchResult:
    """The whole bench: oracle, warm-up, the timed grid, the tracing pairs, summarised into cells."""
    from tqdm import tqdm

    settings = with_device(settings, pair)
    settings.validate()
    started = now_iso()
    machine = machine_info(pair)
    prompts = select_prompts(pair, texts, settings.num_prompts, settings.max_new_tokens)
    total = len(prompts.ids) + count_runs(settings)
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=not show_progress) as bar:

        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        prompts.references = greedy_references(
            pair, prompts.ids, settings.max_new_tokens, progress=lambda phase, done, count: tick(phase)
        )
        warm_up(pair, prompts, settings)
        samples = run_matrix(pair, prompts, settings, tick)
        tracing = measure_tracing(pair, prompts, settings, tick)
        watched = measure_watch(pair, prompts, settings, tick)
    machine["load_average_end"] = load_average()
    return BenchResult(
        command=command,
        started_at=started,
        finished_at=now_iso(),
        machine=machine,
        settings=settings,
        prompts=prompts.describe(),
        cells=make_cells(settings, samples),
        tracing=tracing.get("eqspec") or next(iter(tracing.values()), None),
        tracing_by_arm=tracing,
        watch=watched,
    )
