"""The app on a big Parquet trace: open to verdict shown, the first page, one step move.

Writes a synthetic EQSPEC run (`specviz/trace/synthetic.py`: batch 128, k = 4, 256 new tokens;
10,240 prompts is 1.1M row-steps) a row group at a time, or reuses it, then times what the app's
events call, without a browser, in this one process (imports warm, as in a serving app):

- verdict: `load_local` (the Parquet footer, the streaming check) + `slot_summary_markdown`,
  what `python app.py --trace PATH` does before the page shows slot A's verdict;
- first page: the detail tabs of the opened run (grid at the start step, which builds the grid's
  columnar history, the timeline, the acceptance and KV tabs over their capped steps);
- step move: `grid_view` of step i+1 after step i, from the start step on; moves into a new row
  group (one row group read) are reported apart from moves inside the group already read.

Between the verdict and the first page the collector is tuned as `app.py` tunes it before serving
(`memory.tune_gc_for_serving`: what is loaded is frozen, collections rarer), so pages and moves run
as they do in the app; `--no-serving-gc` keeps Python's defaults (each move then pays full
collections over the loaded run's objects).

Wall and CPU time (user + system of this process) each; medians of `--repeats` opens and of
`--moves` moves.

    python benchmarks/app_scale.py --prompts 10240 --folder bench-out/app-scale
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path


def clock() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime + usage.ru_stime


def since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10_240, help="10,240 prompts: 1.1M row-steps")
    parser.add_argument("--folder", default="bench-out/app-scale")
    parser.add_argument("--repeats", type=int, default=3, help="opens timed (median)")
    parser.add_argument("--moves", type=int, default=40, help="step moves timed (median)")
    parser.add_argument("--no-serving-gc", action="store_true", help="pages and moves under Python's default gc")
    args = parser.parse_args()

    from specviz.app.detail import AcceptanceTab, InvariantsTab, KvTab
    from specviz.app.loading import load_local
    from specviz.app.memory import tune_gc_for_serving
    from specviz.trace.synthetic import write_synthetic_parquet
    from specviz.views import grid_view, slot_summary_markdown

    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"synthetic-{args.prompts}.parquet"
    if not path.exists():
        start = clock()
        rows = write_synthetic_parquet(path, args.prompts, 128, 4, 256)
        print(f"wrote {path}: {rows:,} row-steps in {since(start)[0]:.1f} s", flush=True)

    verdicts, pages = [], []
    for _ in range(args.repeats):
        start = clock()
        loaded = load_local(path)
        summary = slot_summary_markdown(loaded, "A")
        verdicts.append(since(start))
        if not args.no_serving_gc:
            tune_gc_for_serving()  # as app.py does before it serves the page (not timed)
        start = clock()
        step = loaded.start_step_index()
        grid_view(loaded, step, None, 64)
        InvariantsTab(timeline="t", pick="p", violations="v").show(loaded)
        AcceptanceTab(text="x", figure="f", heatmap="h", sequences="s").show(loaded)
        KvTab(kv="k", drift="d").show(loaded)
        pages.append(since(start))
    source = loaded.trace.steps.source
    print(f"{source.num_rows:,} row-steps, {loaded.step_count:,} steps, {source.num_row_groups} row groups")
    print(f"verdict: {loaded.report.verdict}; {summary.splitlines()[0][:100]}")

    inside, across = [], []
    first = loaded.start_step_index()
    # Moves step by step from the start step, then a move into each of the next row groups.
    walk = [(s - 1, s) for s in range(first + 1, min(first + 1 + args.moves, loaded.step_count))]
    starts = [b for b in source.group_starts if first + args.moves < b < loaded.step_count]
    for before, step in walk + [(b - 1, b) for b in starts[: max(args.moves // 8, 1)]]:
        grid_view(loaded, before, None, 64)  # where the user stands (its row group is the one kept)
        start = clock()
        view = grid_view(loaded, step, None, 64)
        (across if step in source.group_starts else inside).append(since(start))
        assert view.step_index == step

    def med(times: list[tuple[float, float]]) -> str:
        if not times:
            return "n/a"
        wall, cpu = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
        return f"{wall:.3f} s wall, {cpu:.3f} s CPU"

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"open -> verdict (median of {len(verdicts)}): {med(verdicts)}")
    print(f"first page, detail tabs (median of {len(pages)}): {med(pages)}")
    print(f"step move inside a row group (median of {len(inside)}): {med(inside)}")
    print(f"step move into the next row group (median of {len(across)}): {med(across)}")
    print(f"slowest step move: {max(t[0] for t in inside + across):.3f} s wall")
    print(f"peak RSS {peak:.0f} MB; load average {os.getloadavg()}; {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
