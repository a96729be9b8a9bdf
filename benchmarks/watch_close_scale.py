"""How the watch's `close` grows with the batch: CPU time of close against the decode it reads.

`close` reads every target call's rows against the sequences alive at it; on an engine that
declares nothing but its emits (the zoo's packed engine: one packed row per forward, rows found by
their chain of draft calls) a reading that compares every row with every sequence, and every
sequence's drafts with every draft row, grows with the square or the cube of the batch while the
decode grows linearly. This runs the packed engine watched at several batch sizes (prompts packed
at once) and prints, per size, the median over repeats of the decode's CPU time, close's CPU time
and their ratio: a ratio that stays flat is a close that scales like the decode.

    PYTHONPATH=tests/watch python benchmarks/watch_close_scale.py --sizes 8,16,32 --max-new-tokens 64

Single-threaded torch (`--threads 1`) and CPU time (`time.process_time`), so another process on a
shared machine inflates neither arm much; the sizes are interleaved across repeats.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys

import torch
from watch_overhead import ARMS, decode  # this folder: the packed run, timed as watch_overhead times it

from specviz.bench.measure import select_prompts
from specviz.data import load_specbench
from specviz.engine.models import load_pair
from specviz.engine.run import RunConfig


def one_run(pair, prompts, config: RunConfig) -> tuple[float, float]:
    """(decode CPU s, close CPU s) of one watched run of the packed engine (`watch_overhead.decode`)."""
    times = {arm: [] for arm in ARMS}
    decode(pair, prompts, config, True, times)
    decoded = times["watched decode"][0][1]
    return decoded, times["watched decode + close"][0][1] - decoded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16,32", help="prompts packed at once, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if importlib.util.find_spec("zoo") is None:
        sys.exit("watch_close_scale: needs the test zoo on the path: PYTHONPATH=tests/watch")
    torch.set_num_threads(args.threads)
    pair = load_pair(device="cpu")
    texts = [p for p in load_specbench("heldout") if len(p) < 1500]
    sizes = [int(s) for s in args.sizes.split(",")]
    prompts = {n: select_prompts(pair, texts, n, args.max_new_tokens) for n in sizes}
    config = RunConfig(max_new_tokens=args.max_new_tokens)
    config.method = "packed"  # `watch_overhead.decode` then runs the zoo's packed engine (no engine method)
    one_run(pair, prompts[sizes[0]], config)  # warm-up: first-call costs out
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    for repeat in range(args.repeats):
        for n in sizes if repeat % 2 == 0 else sizes[::-1]:
            runs[n].append(one_run(pair, prompts[n], config))
            print(f"  repeat {repeat + 1}/{args.repeats}, {n} prompts done", file=sys.stderr, flush=True)
    print(f"threads={args.threads} max_new={args.max_new_tokens} repeats={args.repeats} (medians, CPU time)")
    print("prompts  decode ms  close ms  close/decode")
    for n in sizes:
        decode = statistics.median(d for d, _ in runs[n])
        close = statistics.median(c for _, c in runs[n])
        print(f"{n:7}  {1000 * decode:9.0f}  {1000 * close:8.1f}  {100 * close / decode:11.1f}%")


if __name__ == "__main__":
    main()
