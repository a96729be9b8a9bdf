"""Cost of the KV-content check: decode time and trace size at several sampling rates.

Arms (same prompts, same models, interleaved so machine load hits them alike):
- `off`: tracing on, KV-content check off (kv_check_every = 0), the baseline of both ratios;
- `every N`: the check on every N-th step.
Reports the median decode seconds over `--repeats` runs and the trace size (plain JSON and gzip),
each relative to `off`. On a shared machine whole-run times are noisy, so it also times the check
itself (seconds inside `Engine.check_kv_content`) as a share of the decode time of the same run:
that share is the overhead, measured without the noise of comparing two runs. The draft-call
fields (`draft_position_ids`, `draft_kv_lens`) are recorded in every arm; their own share of the
trace is reported too.

    python benchmarks/kv_check_cost.py --num-prompts 16 --max-new-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics

import torch

from specviz.data import load_specbench
from specviz.engine.config import DEFAULT_KV_CHECK_EVERY
from specviz.engine.models import load_pair
from specviz.engine.run import RunConfig, run
from specviz.engine.step import Engine
from specviz.trace.io import trace_to_json

CHECK_SECONDS = [0.0]


def _timed(method):
    def wrapper(self, *args, **kwargs):
        started = self.now()
        try:
            return method(self, *args, **kwargs)
        finally:
            CHECK_SECONDS[0] += self.now() - started

    return wrapper


Engine.check_kv_content = _timed(Engine.check_kv_content)  # benchmark-only instrumentation


def draft_field_bytes(trace: object) -> int:
    """Bytes the per-draft-call fields take in the plain JSON."""
    rows = [r for s in trace.steps for r in s.rows]
    return sum(len(json.dumps(r.draft_position_ids)) + len(json.dumps(r.draft_kv_lens)) + 44 for r in rows)


def measure(
    pair: object, prompts: list[str], args: argparse.Namespace, every: int
) -> tuple[float, float, int, int, int]:
    config = RunConfig(
        method=args.method,
        batch_size=args.batch_size,
        draft_k=args.draft_k,
        max_new_tokens=args.max_new_tokens,
        reference=False,
        kv_check_every=every,
    )
    CHECK_SECONDS[0] = 0.0
    trace = run(pair, prompts, config)
    text = trace_to_json(trace).encode()
    packed = len(gzip.compress(text, compresslevel=6, mtime=0))
    return trace.header.decode_seconds, CHECK_SECONDS[0], len(text), packed, draft_field_bytes(trace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="eqspec")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rates", default=f"1,4,{DEFAULT_KV_CHECK_EVERY},64")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: a shared CPU's load hurts multi-threaded timings most
    pair = load_pair(device=args.device)
    prompts = load_specbench("heldout")[: args.num_prompts]
    arms = [0] + [int(r) for r in args.rates.split(",")]
    measure(pair, prompts, args, 0)  # warm-up
    seconds: dict[int, list[float]] = {arm: [] for arm in arms}
    shares: dict[int, list[float]] = {arm: [] for arm in arms}
    sizes: dict[int, tuple[int, int, int]] = {}
    for _ in range(args.repeats):
        for arm in arms:
            secs, check_s, plain, packed, draft_bytes = measure(pair, prompts, args, arm)
            seconds[arm].append(secs)
            shares[arm].append(check_s / (secs - check_s))
            sizes[arm] = (plain, packed, draft_bytes)
    base_s, (base_plain, base_gz, _) = statistics.median(seconds[0]), sizes[0]
    rows = []
    for arm in arms:
        med = statistics.median(seconds[arm])
        plain, packed, draft_bytes = sizes[arm]
        rows.append(
            {
                "kv_check_every": arm,
                "decode_s_median": round(med, 4),
                "time_overhead_pct": round(100 * (med / base_s - 1), 2),
                "check_time_pct_of_rest": round(100 * statistics.median(shares[arm]), 2),
                "draft_call_fields_pct_of_json": round(100 * draft_bytes / plain, 2),
                "json_bytes": plain,
                "json_growth_pct": round(100 * (plain / base_plain - 1), 2),
                "gzip_bytes": packed,
                "gzip_growth_pct": round(100 * (packed / base_gz - 1), 2),
            }
        )
    print(json.dumps({"settings": vars(args), "arms": rows}, indent=1))


if __name__ == "__main__":
    main()
