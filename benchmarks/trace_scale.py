"""Load and check time, and peak memory, against trace size, for both containers.

Writes synthetic EQSPEC runs (`specviz/trace/synthetic.py`: batch 128, k = 4, 256 new tokens) at
about 10k, 100k and 1M row-steps (or the issue's 114k and 1.1M), as gzip JSON (written whole) and
as Parquet (written a row group at a time; `--reuse` keeps the files an earlier run wrote), then
times `specviz check` on each in a fresh process (wall time, CPU time and peak RSS from the
kernel), alternating the two containers, `--repeats` times. JSON at the 1M sizes is skipped unless
`--json-at-1m` (it needs GBs to parse).

    python benchmarks/trace_scale.py --out benchmarks/results/trace-scale-2026-12-01.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# prompts at batch 128 x 256 tokens -> row-steps; 114k and 1.1M are the goal sizes
SIZES = {"10k": 96, "100k": 900, "114k": 1_024, "1M": 9_000, "1.1M": 10_240}


def write(prompts: int, folder: Path, json_too: bool, reuse: bool = False) -> dict[str, object]:
    from specviz.trace.columnar_read import ParquetTrace
    from specviz.trace.io import save_trace
    from specviz.trace.synthetic import synthetic_trace, write_synthetic_parquet

    parquet = folder / f"synthetic-{prompts}.parquet"
    json_path = folder / f"synthetic-{prompts}.json.gz"
    if reuse and parquet.exists() and (json_path.exists() or not json_too):
        info: dict[str, object] = {"rows": ParquetTrace(parquet).num_rows, "parquet": parquet, "parquet_write_s": None}
        return {**info, "json": json_path, "json_write_s": None} if json_too else info
    started = time.perf_counter()
    rows = write_synthetic_parquet(parquet, prompts, 128, 4, 256)
    info = {"rows": rows, "parquet": parquet, "parquet_write_s": time.perf_counter() - started}
    if json_too:
        started = time.perf_counter()
        save_trace(synthetic_trace(prompts, 128, 4, 256), json_path)
        info.update(json=json_path, json_write_s=time.perf_counter() - started)
    return info


def time_check(path: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of `specviz check PATH` in a fresh process. On a
    shared machine the CPU time is the steadier of the two: wall time includes waiting for a core."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "specviz", "check", str(path)], capture_output=True, cwd=ROOT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"check {path} failed: {proc.stderr.decode().strip().splitlines()[-1]}")
    return wall, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="bench-out/trace-scale")
    parser.add_argument("--sizes", default="10k,100k,1M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-at-1m", action="store_true")
    parser.add_argument("--out", default=None, help="markdown table to write")
    parser.add_argument("--reuse", action="store_true", help="check the files a run before wrote (write s: -)")
    args = parser.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        "| row-steps | container | file MB | write s | check s (median) | check CPU s (median) | check peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    results = []
    for size in args.sizes.split(","):
        prompts = SIZES[size]
        info = write(prompts, folder, json_too=not size.endswith("M") or args.json_at_1m, reuse=args.reuse)
        arms = [("parquet", info["parquet"], info["parquet_write_s"])]
        if "json" in info:
            arms.append(("json.gz", info["json"], info["json_write_s"]))
        times: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        cpus: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        peaks: dict[str, float] = {}
        for _ in range(args.repeats):  # arms alternate within each repeat
            for name, path, _ in arms:
                wall, cpu = time_check(path)
                times[name].append(wall)
                cpus[name].append(cpu)
        for name, path, _ in arms:  # peak RSS: one more run each, read by /usr/bin/time
            peaks[name] = _peak_rss(path)
        for name, path, write_s in arms:
            row = {
                "row_steps": info["rows"],
                "container": name,
                "file_mb": os.path.getsize(path) / 1e6,
                "write_s": write_s,
                "check_s": statistics.median(times[name]),
                "check_runs_s": times[name],
                "check_cpu_s": statistics.median(cpus[name]),
                "load_average": os.getloadavg(),
                "peak_rss_mb": peaks[name],
            }
            results.append(row)
            lines.append(
                f"| {row['row_steps']:,} | {name} | {row['file_mb']:.1f} | {_seconds(write_s)} | "
                f"{row['check_s']:.2f} | {row['check_cpu_s']:.2f} | {row['peak_rss_mb']:.0f} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(
            f"# Trace scale\n\n`python benchmarks/trace_scale.py {' '.join(sys.argv[1:])}`\n\n{text}\n\n"
            f"```json\n{json.dumps(results, indent=1, default=str)}\n```\n"
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _peak_rss(path: Path) -> float:
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "specviz", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return int(proc.stderr.strip().splitlines()[-1]) / 1024


if __name__ == "__main__":
    main()
