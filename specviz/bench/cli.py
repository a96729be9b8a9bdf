"""`python -m specviz bench`'s command line: options -> settings -> run -> outputs.

The only module of the package that reads argparse options or prints to the terminal.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

from specviz.allocator import keep_freed_memory
from specviz.bench.machine import load_average
from specviz.bench.measure import run_bench
from specviz.bench.render import render_markdown, write_outputs
from specviz.bench.settings import ARMS, QUICK, BenchSettings
from specviz.engine.faults import FAULTS
from specviz.startup import EXIT_INTERRUPTED
from specviz.threads import add_threads_argument, set_threads

# Options that override a field of BenchSettings of the same name when given.
SETTING_OPTIONS = (
    "arms",
    "batch_sizes",
    "draft_ks",
    "num_prompts",
    "max_new_tokens",
    "repeats",
    "tracing_repeats",
    "window_factor",
    "split",
    "seed",
)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small matrix, under 3 minutes on 2 CPU cores")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object on stdout")
    parser.add_argument("--out", default=None, help="output folder (default runs/bench-<time>)")
    add_threads_argument(parser)
    parser.add_argument(
        "--plotlyjs", choices=["inline", "cdn"], default="inline", help="plots.html: offline (4.8 MB) or CDN (small)"
    )
    parser.add_argument("--arms", type=_name_list, default=None, help=f"comma list from {', '.join(ARMS)}")
    parser.add_argument("--faults", type=_name_list, default=None, help="add eqspec+FAULT arms ('all' for every)")
    parser.add_argument("--batch-sizes", type=_int_list, default=None, help="e.g. 1,2,4,8,16,32")
    parser.add_argument("--draft-ks", type=_int_list, default=None, help="e.g. 4,2,8 (the first is the headline)")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--tracing-repeats", type=int, default=None, help="0 skips the tracing measurement")
    parser.add_argument("--window-factor", type=int, default=None, help="EXSPEC window = factor x batch size")
    parser.add_argument("--split", choices=["all", "heldout", "train"], default=None, help="SpecBench split")
    parser.add_argument("--no-check", action="store_true", help="skip the invariant checker's verdicts")
    parser.add_argument("--target", default=None, help="target model (default: embedded)")
    parser.add_argument("--draft", default=None, help="draft model (default: embedded)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--seed", type=int, default=None)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """The quick or default settings with every given option applied, validated."""
    base = QUICK if args.quick else BenchSettings()
    overrides = {name: getattr(args, name) for name in SETTING_OPTIONS if getattr(args, name, None) is not None}
    settings = replace(base, **overrides)
    if args.faults:
        faults = sorted(FAULTS) if args.faults == ("all",) else list(args.faults)
        settings.arms = settings.arms + tuple(f"eqspec+{f}" for f in faults if f"eqspec+{f}" not in settings.arms)
    if args.no_check:
        settings.check = False
    settings.validate()
    return settings


def command_line(args: argparse.Namespace) -> str:
    """The bench command as run, rebuilt from the parsed options (for the results' provenance)."""
    parts = ["python -m specviz bench"]
    for name, value in sorted(vars(args).items()):
        if name in ("command", "func") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, tuple):
            parts.append(f"{flag} {','.join(str(v) for v in value)}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def warn_if_busy(device: torch.device) -> None:
    """CPU timings on a machine busy with other work are noise: say so before spending the time."""
    load = load_average()
    cores = os.cpu_count() or 1
    if device.type == "cpu" and load is not None and load[0] > 0.5 * cores:
        print(
            f"specviz: warning: load average {load[0]:.1f} on {cores} cores before the bench; "
            "timings (tokens/s, shares, speedups) will be noisy. Exactness is unaffected.",
            file=sys.stderr,
        )


def run_from_args(args: argparse.Namespace) -> int:
    """Run the bench the options describe, write its outputs, print markdown or JSON; the exit status."""
    from specviz.data import load_specbench
    from specviz.engine.models import load_pair

    settings = settings_from_args(args)
    set_threads(args.threads)
    keep_freed_memory()  # every arm reuses freed tensors instead of page-faulting them in each step
    # Local time in the folder name: it is for the person looking for today's run.
    out = Path(args.out) if args.out else Path("runs") / f"bench-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    warn_if_busy(pair.device)
    try:
        result = run_bench(pair, load_specbench(settings.split), settings, command_line(args))
    except KeyboardInterrupt:
        print("specviz: bench interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    paths = write_outputs(result, out, args.plotlyjs)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(render_markdown(result))
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0
