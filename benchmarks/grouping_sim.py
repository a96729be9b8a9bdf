"""EXSPEC grouping without models: the real policy code on simulated acceptance, in seconds.

Group share depends on the prompt lengths, the window, the batch size and how many drafts rows
accept, not on the model's numbers. This drives `specviz.engine.methods.exspec`'s own `admission_order`
and `select_group` over sequences with the SpecBench prompt lengths (tokenized with the embedded
default pair's tokenizer, or with --lengths chars4: characters / 4), where each served row accepts
a draft with probability --accept per position (stopping at the first miss, at most k), and
reports per policy: group share, full-batch group share, rows per step and steps (fewer steps
for the same tokens = more throughput when a step costs the same at any width).

    python benchmarks/grouping_sim.py                     # batch 8, window 48, all 480 prompts
    python benchmarks/grouping_sim.py --lengths chars4 --max-new-tokens 16,32,64 --accept 0.3,0.6
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

from specviz.bench import provenance
from specviz.engine.batch import SeqState
from specviz.engine.methods.grouping import POLICIES, admission_order, select_group

NO_EOS: frozenset[int] = frozenset()


def prompt_lengths(source: str) -> list[int]:
    from specviz.data import load_specbench

    prompts = load_specbench()
    if source == "chars4":
        return [max(1, len(p) // 4) for p in prompts]
    from specviz.engine.models import DEFAULT_TARGET, load_tokenizer

    tokenizer = load_tokenizer(source if source != "default" else DEFAULT_TARGET)
    return [len(tokenizer(p)["input_ids"]) for p in prompts]


def accepted(rng: random.Random, accept: float, k: int) -> int:
    count = 0
    while count < k and rng.random() < accept:
        count += 1
    return count


def simulate(lengths: list[int], policy: str, args: argparse.Namespace, max_new: int, accept: float, seed: int) -> dict:
    rng = random.Random(seed)
    seqs = [SeqState(seq_id=i, prompt_ids=[0] * n) for i, n in enumerate(lengths)]
    queue = admission_order(seqs, policy)
    steps = grouped = full = rows = 0
    while True:
        window = [s for s in queue if not s.done][: args.window]
        if not window:
            break
        chosen = select_group(window, args.batch_size, policy)
        one_length = len({s.committed for s in chosen}) == 1
        for seq in chosen:
            seq.append([3] * (accepted(rng, accept, args.draft_k) + 1), max_new, NO_EOS)
        steps += 1
        rows += len(chosen)
        grouped += one_length
        full += one_length and len(chosen) == args.batch_size
    return {"group share": grouped / steps, "full groups": full / steps, "rows/step": rows / steps, "steps": steps}


def averaged(lengths: list[int], policy: str, args: argparse.Namespace, max_new: int, accept: float) -> dict:
    runs = [simulate(lengths, policy, args, max_new, accept, seed) for seed in range(args.seeds)]
    return {key: statistics.fmean(r[key] for r in runs) for key in runs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="default", help="default (embedded tokenizer), chars4, or a path")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--window", type=int, default=48)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", default="32", help="comma list")
    parser.add_argument("--accept", default="0.3,0.6", help="per-position draft acceptance, comma list")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    lengths = prompt_lengths(args.lengths)
    print(provenance("python benchmarks/grouping_sim.py " + " ".join(sys.argv[1:] if argv is None else argv)))
    print(
        f"{len(lengths)} prompts ({args.lengths} lengths, mean {statistics.fmean(lengths):.0f}), "
        f"batch {args.batch_size}, window {args.window}, k={args.draft_k}, mean of {args.seeds} seeds"
    )
    print("| max new | accept | policy | group share | full groups | rows/step | steps |")
    print("|---|---|---|---|---|---|---|")
    for max_new in (int(m) for m in args.max_new_tokens.split(",")):
        for accept in (float(a) for a in args.accept.split(",")):
            for policy in args.policies.split(","):
                r = averaged(lengths, policy, args, max_new, accept)
                print(
                    f"| {max_new} | {accept} | {policy} | {r['group share']:.1%} | {r['full groups']:.1%} | "
                    f"{r['rows/step']:.2f} | {r['steps']:.0f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
