"""Cost of EXSPEC's mixed chunked prefill against whole-prompt prefill, whole decoding runs.

Arms (same prompts, batch, window and draft length; EXSPEC, greedy, no recorder-side checks):
`whole` (`--prefill-chunk 0`: each sequence prefilled alone, in forwards of its own, when first
chosen), `mixed N` (`--prefill-chunk N`: a waiting prompt's next N tokens ride in the running
rows' verify forward, `engine/mixed.py`) and, for reference, `own N` (the same chunks, each in a
target forward of its own: the mix switched off by patching `admission.mixes`). Each arm decodes
every prompt to the end; the timing is the whole `run` (prefill, steps, recording). Arms are
interleaved within each repeat, after one warm-up run of each, so machine load hits them alike;
the report is each arm's median seconds over `--repeats`, its ratio to `whole` within the same
run, its verify steps and its chunks (carried by a verify step / in a forward of their own). Every
arm's outputs must equal `whole`'s (token-exact), or the script stops.

    python benchmarks/chunked_prefill_mixed.py --num-prompts 12 --batch-size 4 --chunks 32,128 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager
from unittest import mock

import torch

from specviz.analysis.prefill_checks import carried_chunks
from specviz.data import load_specbench
from specviz.engine.config import RunConfig
from specviz.engine.methods import exspec
from specviz.engine.models import load_pair
from specviz.engine.run import run


@contextmanager
def unmixed(own: bool):
    """`own`: chunks get target forwards of their own (EXSPEC's path before mixing)."""
    if not own:
        yield
        return
    with mock.patch.object(exspec, "mixes", lambda engine: False):
        yield


def decode(pair, prompts, args, chunk: int, own: bool):
    config = RunConfig(
        method="exspec",
        batch_size=args.batch_size,
        draft_k=args.k,
        max_new_tokens=args.max_new_tokens,
        prefill_chunk=chunk,
        exspec_window=args.window,
        kv_check_every=0,
        reference=False,
    )
    with unmixed(own):
        started = time.perf_counter()
        trace = run(pair, prompts, config)
        return time.perf_counter() - started, trace


def outputs(trace):
    return [s.output_ids for s in sorted(trace.sequences, key=lambda s: s.seq_id)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--window", type=int, default=None, help="exspec window (default 6 x batch)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--chunks", default="32,128", help="comma list of chunk sizes N")
    parser.add_argument("--own", action="store_true", help="also time each N with chunks in forwards of their own")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(device="cpu")
    prompts = load_specbench("heldout")[: args.num_prompts]
    lengths = [len(pair.tokenizer(p)["input_ids"]) for p in prompts]
    arms = {"whole": (0, False)}
    for n in (int(n) for n in args.chunks.split(",")):
        arms[f"mixed {n}"] = (n, False)
        if args.own:
            arms[f"own {n}"] = (n, True)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    shape: dict[str, tuple[int, int, int]] = {}
    reference = None
    for name, (chunk, own) in arms.items():  # warm-up; outputs must agree
        _, trace = decode(pair, prompts, args, chunk, own)
        chunks = [c for s in trace.steps for r in s.rows for c in r.prefill_chunks or ()]
        shape[name] = (len(trace.steps), len(carried_chunks(trace)), len(chunks) - len(carried_chunks(trace)))
        if reference is None:
            reference = outputs(trace)
        elif outputs(trace) != reference:
            raise SystemExit(f"{name}: outputs differ from whole-prompt prefill")
    for _ in range(args.repeats):
        for name, (chunk, own) in arms.items():  # interleaved: each repeat runs every arm once
            seconds[name].append(decode(pair, prompts, args, chunk, own)[0])
    print(
        f"prompts {len(prompts)} (tokens {min(lengths)}..{max(lengths)}), batch {args.batch_size}, "
        f"window {args.window or 6 * args.batch_size}, k {args.k}, max new {args.max_new_tokens}, "
        f"repeats {args.repeats}; outputs identical in every arm"
    )
    whole = statistics.median(seconds["whole"])
    print("| arm | verify steps | chunks carried | chunks alone | median s | ratio to whole |")
    print("|---|---|---|---|---|---|")
    for name in arms:
        steps, carried, alone = shape[name]
        median = statistics.median(seconds[name])
        print(f"| {name} | {steps} | {carried} | {alone} | {median:.3f} | {median / whole:.2f} |")


if __name__ == "__main__":
    main()
