"""`specviz record`'s inputs from its flags: the prompts, the engine's RunConfig, the progress bars."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from specviz.errors import SpecvizError


def record_prompts(args: argparse.Namespace) -> list[str]:
    from specviz.data import load_prompts_file, load_specbench

    prompts = load_prompts_file(args.prompts) if args.prompts else load_specbench()
    if args.num_prompts is not None:
        if args.num_prompts < 1:
            raise SpecvizError("--num-prompts must be at least 1")
        prompts = prompts[: args.num_prompts]
    return prompts


def run_config(args: argparse.Namespace) -> Any:
    """`record`'s flags as the engine's RunConfig (validated by the caller)."""
    from specviz.engine.config import RunConfig

    return RunConfig(
        method=args.method,
        fault=args.fault,
        batch_size=args.batch_size,
        draft_k=args.draft_k,
        proposer=getattr(args, "proposer", "draft-model"),
        head_path=getattr(args, "head", None),
        tree_branches=getattr(args, "tree", 0),
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        sampling=args.sampling,
        exspec_window=args.window,
        exspec_policy=args.policy,
        reference=not args.no_reference,
        kv_check_every=RunConfig.kv_check_every if args.kv_check_every is None else args.kv_check_every,
    )


def progress_bars(bars: dict[str, Any]) -> Any:
    """The run's progress callback: one tqdm bar per phase on stderr, kept in `bars` to close."""
    from tqdm import tqdm

    def progress(phase: str, done: int, total: int) -> None:
        if phase not in bars:
            unit = "prompts" if phase == "reference" else "tokens"  # what `done` counts (engine.run.Progress)
            bars[phase] = tqdm(total=total, desc=phase, unit=unit, file=sys.stderr, leave=False)
        bar = bars[phase]
        if total != bar.total:  # the total shrinks as sequences stop early
            bar.total = total
        bar.update(done - bar.n)

    return progress
