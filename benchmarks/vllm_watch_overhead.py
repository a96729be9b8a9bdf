"""The vLLM watch's CPU cost: one engine, generate() unwatched and watched, arms interleaved.

The watched arm records every runner step (`capture`: the wrappers copy the metadata and write one
JSON line per step) and then builds the trace from the records without the reference decode
(`assemble`, the part that grows with the run); the unwatched arm is the same generate() alone.
CPU seconds of the calling thread (the in-process engine core steps there, one OpenMP thread, and
the watch works there; other threads' waiting is left out), one untimed warm-up per arm, then
`--repeats` rounds, each round both arms in alternating order; the result is the median over
rounds of watched / unwatched within the round (the machine's load drifts between rounds, not
within one). Goal: <= 1.10.
Run in the vLLM venv (docs/vllm.md):

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 \
        V/bin/python benchmarks/vllm_watch_overhead.py --method draft_model --max-tokens 128 --repeats 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _name, _value in (
    ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
    ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    ("OMP_NUM_THREADS", "1"),
):
    os.environ.setdefault(_name, _value)

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="draft_model", choices=("none", "ngram", "draft_model"))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--copies", type=int, default=2, help="the script's 8 prompts, this many times")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import importlib.util

    from vllm import LLM, SamplingParams

    from specviz.watch.vllm import capture
    from specviz.watch.vllm.steps import assemble
    from specviz.watch.vllm.trace import read_records

    spec = importlib.util.spec_from_file_location("offline_script", ROOT / "tests" / "vllm" / "offline_script.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    llm = LLM(
        model=str(script.ASSETS / "default-target"),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        max_num_seqs=8 * args.copies,
        kv_cache_memory_bytes=64 << 20,
        enable_prefix_caching=False,  # every round computes the same work
        speculative_config=script.SPECULATION[args.method],
    )
    prompts = script.PROMPTS * args.copies
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)

    def unwatched() -> float:
        start = time.thread_time()
        llm.generate(prompts, params, use_tqdm=False)
        return time.thread_time() - start

    def watched(build: bool) -> float:
        with tempfile.TemporaryDirectory() as folder:
            start = time.thread_time()
            capture.install(folder)
            try:
                llm.generate(prompts, params, use_tqdm=False)
            finally:
                capture.uninstall()
            if build:
                assert assemble(read_records(Path(folder))).steps, "the watched arm recorded no step"
            return time.thread_time() - start

    arms = {
        "unwatched": unwatched,
        "recorded": lambda: watched(build=False),  # the records alone: what decoding pays
        "watched": lambda: watched(build=True),  # and the trace steps built from them
    }
    for arm in arms.values():  # warm: kernels, allocator, the first-step hooks
        arm()
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.repeats):
        order = list(arms)[r % 3 :] + list(arms)[: r % 3]  # each arm first in turn
        for name in order:
            times[name].append(arms[name]())
    print(
        f"vLLM {sys.modules['vllm'].__version__}, method {args.method}, {len(prompts)} prompts x "
        f"{args.max_tokens} tokens, {args.repeats} rounds (interleaved, after one warm-up each)"
    )
    for name, values in times.items():
        print(f"  {name:9s} CPU s: median {statistics.median(values):.3f}  all {[round(v, 3) for v in values]}")
    for name in ("recorded", "watched"):
        ratios = [w / u for w, u in zip(times[name], times["unwatched"])]
        print(f"  {name} / unwatched per round: {[round(r, 3) for r in ratios]}")
        print(f"  {name} / unwatched, median of the rounds: {statistics.median(ratios):.3f}  (goal <= 1.10)")


if __name__ == "__main__":
    main()
