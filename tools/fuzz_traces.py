"""Long fuzz run of trace loading and checking: `python tools/fuzz_traces.py --cases 200000`.

Mutates valid synthetic and engine-written traces (structure and raw bytes, plain and gzip) and
asserts the contract: load succeeds or raises TraceError with one line; check never raises.
Prints how many cases loaded, how many were refused, and any contract breaks (with their seeds).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
import traceback

from tqdm import tqdm

from specviz.analysis.check import check_trace
from specviz.trace.fuzz import mutate_bytes, mutate_dict
from specviz.trace.io import TraceError, parse_trace_bytes, trace_from_dict, trace_to_json
from specviz.trace.synthetic import synthetic_trace


def one_case(seed: int, texts: list[str]) -> str:
    rng = random.Random(seed)
    text = rng.choice(texts)
    try:
        if rng.random() < 0.5:
            trace = trace_from_dict(mutate_dict(json.loads(text), rng, rng.randrange(1, 5)))
        else:
            raw = mutate_bytes(text.encode(), rng)
            trace = parse_trace_bytes(gzip.compress(raw) if rng.random() < 0.3 else raw, "fuzz")
    except TraceError as exc:
        return "refused" if "\n" not in str(exc) else "multi-line error"
    check_trace(trace)
    return "loaded"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    texts = [trace_to_json(synthetic_trace(n, b, k, m)) for n, b, k, m in ((6, 3, 3, 10), (9, 4, 2, 14), (3, 1, 1, 6))]
    counts: dict[str, int] = {}
    failures = []
    started = time.perf_counter()
    for seed in tqdm(range(args.seed, args.seed + args.cases), desc="fuzz", unit="case"):
        try:
            outcome = one_case(seed, texts)
        except Exception:  # noqa: BLE001 - a contract break is exactly what we are hunting
            outcome = "CRASH"
            failures.append((seed, traceback.format_exc(limit=3)))
        counts[outcome] = counts.get(outcome, 0) + 1
    elapsed = time.perf_counter() - started
    print(json.dumps({"cases": args.cases, "seconds": round(elapsed, 1), "outcomes": counts}))
    for seed, tb in failures[:10]:
        print(f"--- seed {seed}\n{tb}")
    return 1 if failures or counts.get("multi-line error") else 0


if __name__ == "__main__":
    sys.exit(main())
