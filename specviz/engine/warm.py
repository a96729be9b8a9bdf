"""Warm timings on accelerators: the first decode in a fresh CUDA process is much slower than the next.

Kernel selection, allocator growth and lazy initialisation all land on the first run of each shape,
so a figure taken cold measures start-up, not decoding (benchmarks/README.md, "Warm timings").
`warm_up_run` runs the same decode once, untimed (same prompts, batch size, draft length and token
budget, so the same shapes; no oracle, no recorder), and `mark_warm` states in the trace header
whether the timed run was warm.
"""

from __future__ import annotations

import time
from dataclasses import replace

from specviz.engine.clock import synchronize
from specviz.engine.models import ModelPair
from specviz.engine.run import RunConfig, run
from specviz.trace.schema import Trace


def needs_warm_up(pair: ModelPair) -> bool:
    """On CPU the first run costs little more than the next; on CUDA it is mostly start-up."""
    return pair.device.type == "cuda"


def warm_up_run(pair: ModelPair, prompts: list[str], config: RunConfig) -> float:
    """One untimed decode over the run's shapes; returns its wall seconds (the cold figure)."""
    started = time.perf_counter()
    run(pair, prompts, replace(config, reference=False, record_steps=False))
    synchronize(pair.device)
    return time.perf_counter() - started


def mark_warm(trace: Trace, pair: ModelPair, warm_up_seconds: float | None) -> None:
    """On CUDA, say in `header.options` whether decoding was timed after a warm-up, and the cold time."""
    if pair.device.type != "cuda":
        return
    trace.header.options["warm"] = warm_up_seconds is not None
    if warm_up_seconds is not None:
        trace.header.options["warm_up_seconds"] = round(warm_up_seconds, 4)
