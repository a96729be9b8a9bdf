"""Where `inplace`'s alignment time goes: row copies when rows finish vs the per-step settle.

`inplace` never moves a slot between steps; its alignment time (what the trace records as
`align_ms`) is the settle after each step (`apply_plan`: new lengths, the region mask marked in
place) plus, on steps where rows finished, copying the surviving rows past the new prefix into
the finished rows' places (`RegionCache.fill_holes`, only the slots each mover attends). This times both
inside real runs and reports them as shares of the recorded step time.

    OMP_NUM_THREADS=1 python benchmarks/inplace_align.py --batch-size 32 --num-prompts 32 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import specviz.engine.methods.inplace as inplace
from specviz.bench import select_prompts
from specviz.data import load_specbench
from specviz.engine.models import load_pair
from specviz.engine.run import RunConfig, run
from specviz.threads import set_threads

SPENT: dict[str, float] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] = SPENT.get(name, 0.0) + time.perf_counter() - started

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    inplace.apply_plan = timed("settle", inplace.apply_plan)  # includes the copies below
    inplace.RegionCache.fill_holes = timed("copies", inplace.RegionCache.fill_holes)
    pair = load_pair(device="cpu", dtype="float32")
    spread = select_prompts(pair, load_specbench(), args.num_prompts, args.max_new_tokens).texts  # the bench's
    config = RunConfig(
        method="inplace",
        batch_size=args.batch_size,
        draft_k=args.draft_k,
        max_new_tokens=args.max_new_tokens,
        reference=False,
    )
    run(pair, spread[: args.batch_size], config)  # warm-up, untimed
    shares: dict[str, list[float]] = {"align": [], "copies": [], "settle": []}
    for _ in range(args.repeats):
        SPENT.clear()
        trace = run(pair, spread, config)
        step_ms = sum(s.total_ms for s in trace.steps)
        align_ms = sum(s.align_ms for s in trace.steps)
        copies_ms = SPENT.get("copies", 0.0) * 1000
        shares["align"].append(align_ms / step_ms)
        shares["copies"].append(copies_ms / step_ms)
        shares["settle"].append((SPENT.get("settle", 0.0) * 1000 - copies_ms) / step_ms)
    setting = f"{len(spread)} prompts, {args.max_new_tokens} new tokens, k={args.draft_k}"
    print(f"inplace, batch {args.batch_size}, {setting}")
    for name, values in shares.items():
        each = ", ".join(f"{v:.2%}" for v in values)
        print(f"- {name}: median {statistics.median(values):.2%} of step time ({each})")


if __name__ == "__main__":
    main()
