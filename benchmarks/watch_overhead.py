"""What watching costs: decode wall time of the same run, unwatched vs under `specviz.watch`.

specviz's own engine with its recorder off (and no reference decode) is the engine under test;
the watched arm adds the hooks, the `rows`/`emit` calls and `close(reference=False)` (step
assembly included). Arms are interleaved and repeated, and the median of each is compared, so
a busy machine hurts both arms alike. The issue's bar: at most 10% slower.

    python benchmarks/watch_overhead.py --threads 2 --repeats 5
    python benchmarks/watch_overhead.py --device cuda --batch-size 8 --num-prompts 32
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specviz.bench.measure import PromptSet, run_unwatched, run_watched, select_prompts
from specviz.data import load_specbench
from specviz.engine.models import ModelPair, load_pair
from specviz.engine.run import RunConfig


def decode(pair: ModelPair, prompts: PromptSet, config: RunConfig, watched: bool) -> float:
    """Seconds for one run (plus the watch's close when watched): the bench's own two arms."""
    return run_watched(pair, prompts, config)[1] if watched else run_unwatched(pair, prompts, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--method", default="eqspec", choices=["baseline", "eqspec", "exspec"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(device=args.device)
    texts = [p for p in load_specbench("heldout") if len(p) < 1500]
    prompts = select_prompts(pair, texts, args.num_prompts, args.max_new_tokens)
    warm = select_prompts(pair, texts, 2, args.max_new_tokens)
    config = RunConfig(method=args.method, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    config.reference, config.record_steps = False, False
    decode(pair, warm, config, watched=True)  # warm-up: first-call costs out of both arms
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for watched in (False, True):
            times[watched].append(decode(pair, prompts, config, watched))
    plain, watched = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"device={args.device} threads={args.threads} method={args.method} batch={args.batch_size} "
        f"prompts={args.num_prompts} max_new={args.max_new_tokens} repeats={args.repeats}"
    )
    print(f"unwatched median {plain:.3f} s  {[round(t, 3) for t in times[False]]}")
    print(f"watched   median {watched:.3f} s  {[round(t, 3) for t in times[True]]}")
    print(f"overhead {100 * (watched / plain - 1):+.1f}%")


if __name__ == "__main__":
    main()
