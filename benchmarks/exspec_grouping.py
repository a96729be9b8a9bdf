"""EXSPEC grouping, before and after: group share on all 480 SpecBench prompts at batch 8, window 48.

One process, arms interleaved (specviz.bench): the batched baseline, EQSPEC, and EXSPEC under each
grouping policy: `reference` (the paper's: exactly B sequences of one length, first in window
order), `largest` (largest equal-length group if it fills half a batch) and `converge` (ours:
length-sorted admission plus shortest-first selection, see specviz/engine/methods/grouping.py). For each it
prints the group share (steps whose batch had one length, so no padding), the share of steps that
were a *full* batch of one length, rows per step, tokens/s against EQSPEC, and exact match against
the batch-1 greedy oracle.

    python benchmarks/exspec_grouping.py --threads 2 --out benchmarks/results/exspec-grouping.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from specviz.bench import BenchResult, BenchSettings, Cell, render_markdown, run_bench, write_outputs

POLICY_ARMS = ("exspec-reference", "exspec-largest", "exspec")


def settings_from(args: argparse.Namespace) -> BenchSettings:
    if args.window % args.batch_size:
        raise SystemExit("--window must be a multiple of --batch-size")
    return BenchSettings(
        arms=("baseline", "eqspec", *POLICY_ARMS),
        batch_sizes=(args.batch_size,),
        draft_ks=(args.draft_k,),
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        tracing_repeats=0,
        window_factor=args.window // args.batch_size,
        check=not args.no_check,
    )


def _row(name: str, cell: Cell, eqspec: Cell) -> str:
    share = "-" if cell.group_share is None else f"{cell.group_share:.1%}"
    full = "-" if cell.full_group_share is None else f"{cell.full_group_share:.1%}"
    return (
        f"| {name} | {share} | {full} | {cell.rows_per_step:.2f} | {cell.steps} | {cell.tokens_per_second:.1f} | "
        f"{cell.tokens_per_second / eqspec.tokens_per_second:.2f}x | {cell.alignment_share:.1%} | "
        f"{cell.exact_match:.3f} |"
    )


def policy_table(result: BenchResult, batch_size: int) -> str:
    eqspec = result.cell("eqspec", batch_size)
    lines = [
        "| arm (policy) | group share | full-batch groups | rows/step | steps | tok/s | vs eqspec | align % | exact |",
        "|---|---|---|---|---|---|---|---|---|",
        _row("eqspec", eqspec, eqspec),
    ]
    for arm in POLICY_ARMS:
        cell = result.cell(arm, batch_size)
        lines.append(_row(f"{arm} ({cell.policy})", cell, eqspec))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from specviz.data import load_specbench
    from specviz.engine.models import load_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=480)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--window", type=int, default=48)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-check", action="store_true", help="skip the invariant checker")
    parser.add_argument("--target", default=None)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="markdown report path")
    parser.add_argument("--bench-out", default=None, help="also write the bench's CSV/JSON/plots here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.draft, device=args.device)
    command = "python benchmarks/exspec_grouping.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = run_bench(pair, load_specbench(), settings_from(args), command)
    text = "\n".join(
        [
            f"# EXSPEC grouping: batch {args.batch_size}, window {args.window}",
            "",
            policy_table(result, args.batch_size),
            "",
            render_markdown(result).replace("# specviz bench", "## Full bench output", 1),
        ]
    )
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    if args.bench_out:
        write_outputs(result, Path(args.bench_out), plotlyjs="cdn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
