"""Alignment time of each step, per method, in one process: where a method's alignment goes step by step.

The bench reports alignment ms per step as one mean; this prints every step's `align_ms` and
row count for each arm, arms alternating within each repeat after one untimed warm-up run per
arm, so two methods' moves of the same shapes can be compared step by step (e.g. EXSPEC's
rebuild of an unchanged group against EQSPEC's realignment).

    OMP_NUM_THREADS=1 python benchmarks/align_per_step.py --arms eqspec,exspec --batch-size 32
"""

from __future__ import annotations

import argparse

from specviz.allocator import keep_freed_memory
from specviz.bench import select_prompts
from specviz.data import load_specbench
from specviz.engine.models import load_pair
from specviz.engine.run import RunConfig, run
from specviz.threads import set_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="eqspec,exspec", help="methods, comma-separated")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    keep_freed_memory()  # as `record` and `bench` do
    pair = load_pair(device="cpu", dtype="float32")
    prompts = select_prompts(pair, load_specbench(), args.num_prompts, args.max_new_tokens).texts  # the bench's
    arms = args.arms.split(",")

    def config(method: str) -> RunConfig:
        k = 0 if method == "baseline" else args.draft_k
        return RunConfig(
            method=method, batch_size=args.batch_size, draft_k=k, max_new_tokens=args.max_new_tokens, reference=False
        )

    for method in arms:  # warm-up, untimed
        run(pair, prompts[: args.batch_size], config(method))
    print(f"batch {args.batch_size}, {len(prompts)} prompts, {args.max_new_tokens} new tokens, k={args.draft_k}")
    for repeat in range(args.repeats):
        for method in arms:
            trace = run(pair, prompts, config(method))
            align = [s.align_ms for s in trace.steps]
            total = sum(s.total_ms for s in trace.steps)
            print(
                f"repeat {repeat} {method}: {sum(align):.0f} ms of alignment over {len(align)} steps "
                f"({sum(align) / len(align):.1f} ms/step, {sum(align) / total:.1%} of step time)"
            )
            print(f"  align ms: {[round(a, 1) for a in align]}")
            print(f"  rows:     {[len(s.rows) for s in trace.steps]}")


if __name__ == "__main__":
    main()
