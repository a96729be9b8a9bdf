"""Chain vs tree, head vs draft model, per method: tokens/s and mean acceptance length on the
embedded default pair and its draft head, through `specviz.bench` (arms interleaved, repeats, on
CUDA the first repeat dropped as warm-up), plus what each head fault costs in acceptance against
the same run without it (`specviz.analysis.drafting.drafting_cost`).

    python benchmarks/drafting.py                      # CPU: a few minutes (batch 1 and 8)
    python benchmarks/drafting.py --batch-sizes 1 8 32 --out benchmarks/results/drafting-h200.md

The default pair is small (a 4-layer, 128-wide target): on a GPU these arms measure the engine's
overhead per step more than the models' compute; the acceptance columns hold on any device.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specviz.analysis.drafting import drafting_cost
from specviz.bench import BenchSettings, run_bench
from specviz.bench.render import markdown_table
from specviz.bench.settings import DRAFTING_ARMS
from specviz.data import load_specbench
from specviz.engine.config import RunConfig
from specviz.engine.models import load_pair
from specviz.engine.run import run

HEAD_FAULTS = (("head-source-index", "exspec"), ("shared-carry", "eqspec"))


def fault_costs(pair, prompts: list[str], args: argparse.Namespace) -> list[str]:
    """One line per head fault: acceptance with it vs the same run (prompts, settings) without it."""
    lines = [
        "| fault | method | batch | acc rate with / without | mean acc len with / without | exact |",
        "|---|---|---|---|---|---|",
    ]
    batch = max(args.batch_sizes)
    for fault, method in HEAD_FAULTS:
        base = dict(method=method, batch_size=batch, draft_k=args.draft_k, max_new_tokens=args.max_new_tokens)
        clean = run(pair, prompts, RunConfig(**base, proposer="head"))
        faulty = run(pair, prompts, RunConfig(**base, proposer="head", fault=fault))
        cost = drafting_cost(faulty, clean)
        lines.append(
            f"| `{fault}` | {method} | {batch} | {cost.rate_with:.3f} / {cost.rate_without:.3f} | "
            f"{cost.mean_length_with:.2f} / {cost.mean_length_without:.2f} | {cost.exact_with:.3f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here too")
    args = parser.parse_args(argv)
    pair = load_pair(device=args.device)
    settings = BenchSettings(
        arms=("baseline", *DRAFTING_ARMS),
        batch_sizes=tuple(args.batch_sizes),
        draft_ks=(args.draft_k,),
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        tracing_repeats=0,
        split="heldout",
    )
    started = time.perf_counter()
    result = run_bench(pair, load_specbench("heldout"), settings, "benchmarks/drafting.py")
    prompts = load_specbench("heldout")[: args.num_prompts]
    lines = [
        "# Chain vs tree, head vs draft model (default pair)",
        "",
        f"- device {pair.device}, dtype {pair.dtype}; {args.num_prompts} held-out SpecBench prompts, "
        f"{args.max_new_tokens} new tokens, k={args.draft_k}, trees with 2 alternatives; {args.repeats} repeats, "
        f"arms interleaved{', first repeat dropped (warm)' if pair.device.type == 'cuda' else ''}",
        f"- machine: {result.machine.get('processor')}, {result.machine.get('cpu_count')} CPUs, "
        f"{result.machine.get('torch_threads')} torch threads, {result.machine.get('gpu', 'no GPU')}",
        "",
        markdown_table(result.cells),
        "",
        "## What a head fault costs (same prompts and settings, with and without it)",
        "",
        *fault_costs(pair, prompts, args),
        "",
        f"total {time.perf_counter() - started:.0f} s",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
