"""`python -m specviz bench`: exactness and cost of batched speculative decoding, side by side.

One command decodes the same prompts with a matrix of *arms* (batched greedy baseline, EQSPEC with
the batched KV move, EQSPEC with the reference's per-row loop, EXSPEC under two grouping policies,
optionally faulty engines) x batch sizes x draft lengths, and reports per cell:
- exactness against the batch-1 greedy oracle, decoded once per prompt set and reused by every cell;
- acceptance (via `specviz.analysis.metrics`);
- tokens/s, and the speedup against the batched baseline of the *same repeat*: within a repeat the
  arms of one batch size run back to back (their order rotated between repeats), and the speedup
  is the median over repeats of the per-repeat ratio, so machine drift cancels;
- the per-step time split into draft, verify, alignment (realignment, grouping, cache moves) and
  the rest (bookkeeping).
Two paired measurements ride along: tracing on vs off (interleaved), and EXSPEC group share.

The modules, in the order a run goes through them:
- `settings`: what to run (arms, `BenchSettings`, the jobs of one repeat);
- `measure`: running the jobs on a model pair (`run_bench`), timing, tracing overhead;
- `results`: the records (`Sample`, `Cell`, `BenchResult`) and the goals they are judged by;
- `render`: markdown, CSV, plots, the output folder;
- `cli`: the command-line options and `run_from_args`;
- `machine`: the provenance of a measurement (machine, versions, load).
"""

from specviz.bench.cli import add_arguments, command_line, run_from_args, settings_from_args
from specviz.bench.machine import load_average, machine_info, provenance
from specviz.bench.measure import PromptSet, measure_tracing, run_bench, run_matrix, sample_trace, select_prompts
from specviz.bench.render import markdown_table, render_markdown, write_csv, write_outputs, write_plots
from specviz.bench.results import BenchResult, Cell, Sample, TracingResult, evaluate_goals, make_cell, make_cells
from specviz.bench.settings import (
    ARMS,
    EXSPEC_POLICY,
    QUICK,
    Arm,
    BenchSettings,
    Job,
    count_runs,
    interleaved,
    jobs_for_batch,
    resolve_arm,
)

__all__ = [
    "ARMS",
    "EXSPEC_POLICY",
    "QUICK",
    "Arm",
    "BenchResult",
    "BenchSettings",
    "Cell",
    "Job",
    "PromptSet",
    "Sample",
    "TracingResult",
    "add_arguments",
    "command_line",
    "count_runs",
    "evaluate_goals",
    "interleaved",
    "jobs_for_batch",
    "load_average",
    "machine_info",
    "make_cell",
    "make_cells",
    "markdown_table",
    "measure_tracing",
    "provenance",
    "render_markdown",
    "resolve_arm",
    "run_bench",
    "run_from_args",
    "run_matrix",
    "sample_trace",
    "select_prompts",
    "settings_from_args",
    "write_csv",
    "write_outputs",
    "write_plots",
]
