"""What watching costs: decode wall time of the same run, unwatched vs under `specviz.watch`.

specviz's own engine with its recorder off (and no reference decode) is the engine under test;
the watched arm adds the hooks and the `rows`/`emit` calls to the decode, and then
`close(reference=False)` (step assembly), which runs once after the decode and is reported apart:
"decode" is the issue's measure (what watching costs the engine while it decodes), "decode +
close" is the whole bill. Both arms are warmed up first. Then each repeat runs one pair, the order
alternating (unwatched first on even repeats, watched first on odd ones), and the overhead is the
median over pairs of watched/unwatched - 1: a ratio within one pair, so a machine whose load
drifts hurts both arms of a pair alike. The issue's bar: at most 5% at batch 8.

Before every timed run the garbage collector is run to completion (untimed), so each run starts
from the same collector state: otherwise whichever run happens to cross the threshold of a full
collection (hundreds of ms with torch and transformers loaded) pays for garbage all earlier runs
left. The collections a run triggers itself stay in its time.

Each run is timed twice: wall clock (the goal's measure) and the process's CPU time, which other
processes on a shared machine inflate far less. `--inside` adds runs that time the watch's own
code alone (its hooks, `rows`, `emit`, `close`) in CPU seconds, the cost as the watch sees it,
against the unwatched arm's CPU time; those runs are not part of the pairs.

    python benchmarks/watch_overhead.py --threads 1 --repeats 9 --batch-size 8 --inside
    python benchmarks/watch_overhead.py --device cuda --batch-size 8 --num-prompts 32

`--engine packed` times the zoo's packed varlen engine instead (`tests/watch/zoo/packed.py`: one
1 x T row per forward, a block-diagonal 4-D mask over a shared cache, the late prompt prefilled in
a decoding step, a budget per prompt), on the same pair and prompts, `--num-prompts` sequences
packed at once; the watched arm declares nothing but its emits, as that engine does. The zoo is
test code, not part of the package: put its folder on the path,

    PYTHONPATH=tests/watch python benchmarks/watch_overhead.py --engine packed --threads 1 --inside
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from specviz.bench.measure import PromptSet, run_unwatched, run_watched, select_prompts
from specviz.data import load_specbench
from specviz.engine.models import ModelPair, load_pair
from specviz.engine.run import RunConfig

Times = dict[str, list[tuple[float, float]]]  # arm -> (wall, CPU) seconds per run
ARMS = ("unwatched", "watched decode", "watched decode + close")


def decode(pair: ModelPair, prompts: PromptSet, config: RunConfig, watched: bool, times: Times) -> None:
    """Time one run from a collected heap; appends (wall, CPU) to its arms in `times`."""
    gc.collect()
    if config.method == "packed":
        decode_packed(pair, prompts, config, watched, times)
        return
    if not watched:
        cpu = time.process_time()
        wall = run_unwatched(pair, prompts, config)
        times["unwatched"].append((wall, time.process_time() - cpu))
        return
    run = run_watched(pair, prompts, config)
    times["watched decode"].append((run.decode_wall, run.decode_cpu))
    times["watched decode + close"].append((run.wall, run.decode_cpu + run.close_cpu))


def decode_packed(pair: ModelPair, prompts: PromptSet, config: RunConfig, watched: bool, times: Times) -> None:
    """The zoo's packed engine, unwatched or under `specviz.watch` (then `close(reference=False)`)."""
    from zoo import packed  # the test zoo's engine, written without specviz (PYTHONPATH=tests/watch)

    import specviz

    budgets = [config.max_new_tokens - 4 * (i % 3) for i in range(len(prompts.ids))]  # one per prompt
    wall, cpu = time.perf_counter(), time.process_time()
    if not watched:
        packed.generate(pair.target, pair.draft, prompts.ids, budgets)
        times["unwatched"].append((time.perf_counter() - wall, time.process_time() - cpu))
        return
    w = specviz.watch(pair.target, pair.draft, prompts=prompts.ids)
    packed.generate(pair.target, pair.draft, prompts.ids, budgets, w=w)
    decode_wall, decode_cpu = time.perf_counter() - wall, time.process_time() - cpu
    w.close(reference=False)
    times["watched decode"].append((decode_wall, decode_cpu))
    times["watched decode + close"].append((time.perf_counter() - wall, time.process_time() - cpu))


@contextmanager
def inside_timer(spent: dict[str, float]) -> Iterator[None]:
    """CPU seconds spent inside the watch's entry points, summed into `spent` by name."""
    from specviz.watch.hooks import ModelHooks
    from specviz.watch.session import Watch

    patched = [(ModelHooks, "before"), (ModelHooks, "after"), (Watch, "rows"), (Watch, "emit"), (Watch, "close")]
    originals = [getattr(owner, name) for owner, name in patched]

    def timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - started

        return run

    for (owner, name), method in zip(patched, originals):
        setattr(owner, name, timed(name, method))
    try:
        yield
    finally:
        for (owner, name), method in zip(patched, originals):
            setattr(owner, name, method)


def pairs(pair: ModelPair, prompts: PromptSet, config: RunConfig, repeats: int) -> Times:
    """`repeats` (unwatched, watched) pairs, the order alternating; (wall, CPU) per run."""
    times: Times = {arm: [] for arm in ARMS}
    for repeat in range(repeats):
        for watched in (False, True) if repeat % 2 == 0 else (True, False):
            decode(pair, prompts, config, watched, times)
    return times


def report(times: Times) -> None:
    for index, clock in ((0, "wall"), (1, "CPU ")):
        plain = [t[index] for t in times["unwatched"]]
        print(f"{clock} {'unwatched':<22} {[round(t, 3) for t in plain]} median {statistics.median(plain):.3f} s")
        for arm in ARMS[1:]:
            watched = [t[index] for t in times[arm]]
            ratios = sorted(w / p - 1 for w, p in zip(watched, plain))
            print(f"{clock} {arm:<22} {[round(t, 3) for t in watched]} median {statistics.median(watched):.3f} s")
            print(
                f"{clock} overhead of {arm}: median of pairs {100 * statistics.median(ratios):+.1f}% "
                f"(pairs {100 * ratios[0]:+.1f}% .. {100 * ratios[-1]:+.1f}%), "
                f"ratio of medians {100 * (statistics.median(watched) / statistics.median(plain) - 1):+.1f}%, "
                f"fastest/fastest {100 * (min(watched) / min(plain) - 1):+.1f}%"
            )


def report_inside(pair: ModelPair, prompts: PromptSet, config: RunConfig, runs: int, plain_cpu: float) -> None:
    """The watch's own CPU time per run, by entry point, as a share of an unwatched run's CPU time:
    during the decode (hooks, `rows`, `emit`) and in total (with `close`)."""
    during, total = [], []
    for _ in range(runs):
        spent: dict[str, float] = {}
        with inside_timer(spent):
            decode(pair, prompts, config, True, {arm: [] for arm in ARMS})
        during.append((sum(spent.values()) - spent.get("close", 0.0)) / plain_cpu)
        total.append(sum(spent.values()) / plain_cpu)
        parts = ", ".join(f"{name} {1000 * seconds:.1f}" for name, seconds in spent.items())
        print(f"inside the watch: {1000 * sum(spent.values()):.1f} ms CPU ({parts} ms)")
    print(
        f"inside the watch: median {100 * statistics.median(during):.1f}% of the unwatched CPU time during "
        f"the decode, {100 * statistics.median(total):.1f}% with close"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--method", default="eqspec", choices=["baseline", "eqspec", "exspec"])
    parser.add_argument(
        "--engine", default="specviz", choices=["specviz", "packed"], help="packed: the zoo's packed engine"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--inside", action="store_true", help="also time the watch's own code (3 more runs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(device=args.device)
    texts = [p for p in load_specbench("heldout") if len(p) < 1500]
    prompts = select_prompts(pair, texts, args.num_prompts, args.max_new_tokens)
    config = RunConfig(method=args.method, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    config.reference, config.record_steps = False, False
    if args.engine == "packed":
        if importlib.util.find_spec("zoo") is None:
            sys.exit("watch_overhead: --engine packed needs the test zoo: PYTHONPATH=tests/watch")
        config.method = "packed"  # `decode` runs the zoo's packed engine
    for watched in (False, True):  # warm-up: first-call costs (and the prompts' shapes) out of both arms
        decode(pair, prompts, config, watched, {arm: [] for arm in ARMS})
    load = os.getloadavg()
    times = pairs(pair, prompts, config, args.repeats)
    print(
        f"device={args.device} threads={args.threads} method={args.method} batch={args.batch_size} "
        f"prompts={args.num_prompts} max_new={args.max_new_tokens} repeats={args.repeats} "
        f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    report(times)
    if args.inside:
        report_inside(pair, prompts, config, 3, statistics.median(t[1] for t in times["unwatched"]))


if __name__ == "__main__":
    main()
