"""Tracing cost measured directly: time spent inside `Recorder.record_step` / decode wall time.

`python -m specviz bench` measures tracing overhead the way a user sees it (decode wall time with
the recorder vs with `NullRecorder`, interleaved), which on a busy machine is noisier than the
effect. This times the recorder itself during real runs, so the answer does not depend on how
quiet the machine is: for each method and batch size, milliseconds per recorded step, the
share of decode wall time spent recording, and the share spent in the sampled KV-content check
(every 16th step by default), the other cost of a traced run: the engine's own tracing time
(`header.options.tracing_seconds`) minus the recording time.

    python benchmarks/recorder_cost.py --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import specviz.engine.run as run_module
from specviz.bench import provenance
from specviz.trace.recorder import Recorder, StepObservation


class TimedRecorder(Recorder):
    """A Recorder that adds up the time its own `record_step` takes (output unchanged)."""

    seconds = 0.0
    steps = 0

    def record_step(self, obs: StepObservation) -> None:
        started = time.perf_counter()
        super().record_step(obs)
        TimedRecorder.seconds += time.perf_counter() - started
        TimedRecorder.steps += 1


def measure(
    pair, texts: list[str], method: str, batch_size: int, args: argparse.Namespace
) -> tuple[float, float, float]:
    """(record ms per step, recording's share of decode time, the KV check's share)."""
    TimedRecorder.seconds, TimedRecorder.steps = 0.0, 0
    config = run_module.RunConfig(
        method=method, batch_size=batch_size, draft_k=args.draft_k, max_new_tokens=args.max_new_tokens, reference=False
    )
    original = run_module.Recorder
    run_module.Recorder = TimedRecorder  # run() builds its recorder from this name
    try:
        trace = run_module.run(pair, texts, config)
    finally:
        run_module.Recorder = original
    per_step_ms = TimedRecorder.seconds / max(TimedRecorder.steps, 1) * 1000
    decode_s = float(trace.header.decode_seconds)
    # The engine times its own tracing (recording and the KV check): the check is the rest of it.
    check_s = float(trace.header.options["tracing_seconds"]) - TimedRecorder.seconds
    return per_step_ms, TimedRecorder.seconds / decode_s, max(check_s, 0.0) / decode_s


def main(argv: list[str] | None = None) -> int:
    from specviz.bench import select_prompts
    from specviz.data import load_specbench
    from specviz.engine.models import load_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="baseline,eqspec,exspec")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--target", default=None)
    parser.add_argument("--draft", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.draft)
    texts = select_prompts(pair, load_specbench(), args.num_prompts, args.max_new_tokens).texts
    print(provenance("python benchmarks/recorder_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)))
    print(f"{len(texts)} SpecBench prompts, {args.max_new_tokens} new tokens, k={args.draft_k}")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    run_module.run(pair, texts[:8], run_module.RunConfig(max_new_tokens=4, reference=False))  # warm-up, untimed
    print(
        "| method | batch | record ms/step | recording, share of decode | KV check, share of decode | tracing in all |"
    )
    print("|---|---|---|---|---|---|")
    for method in args.methods.split(","):
        for batch_size in batch_sizes:
            per_step, share, check = measure(pair, texts, method, batch_size, args)
            print(f"| {method} | {batch_size} | {per_step:.3f} | {share:.2%} | {check:.2%} | {share + check:.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
