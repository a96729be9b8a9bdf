"""`specviz record`: its inputs from its flags (the prompts, the engine's RunConfig, the progress
bars), the run, where its trace is saved (a complete trace is never replaced by a shorter one) and
the summary it prints. `specviz/cli.py` defines the flags and dispatches here."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import signal
import sys
from pathlib import Path
from typing import Any

from specviz.console import print_to_pipe
from specviz.errors import SpecvizError
from specviz.files import beside, check_output_path
from specviz.proposers import DEFAULT_PROPOSER
from specviz.startup import EXIT_INTERRUPTED
from specviz.trace.file_kinds import check_trace_name
from specviz.trace.naming import run_slug, run_title


def record_prompts(args: argparse.Namespace) -> list[str]:
    from specviz.data import load_prompts_file, load_specbench

    prompts = load_prompts_file(args.prompts) if args.prompts else load_specbench()
    if args.num_prompts is not None:
        if args.num_prompts < 1:
            raise SpecvizError("--num-prompts must be at least 1")
        prompts = prompts[: args.num_prompts]
    return prompts


def record_method(args: argparse.Namespace) -> str:
    """--method; without it, the injected fault's own method (`Fault.default_method`: one where it
    fires, as docs/faults.md names it), else eqspec."""
    if args.method is not None:
        return args.method
    if args.fault:
        from specviz.engine.faults import FAULTS

        return FAULTS[args.fault].default_method
    return "eqspec"


def run_config(args: argparse.Namespace) -> Any:
    """`record`'s flags as the engine's RunConfig (validated by the caller)."""
    from specviz.engine.config import RunConfig

    return RunConfig(
        method=record_method(args),
        fault=args.fault,
        batch_size=args.batch_size,
        draft_k=args.draft_k,
        proposer=getattr(args, "proposer", DEFAULT_PROPOSER),
        head_path=getattr(args, "head", None),
        tree_branches=getattr(args, "tree", 0),
        tree_kind=getattr(args, "tree_kind", "static"),
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


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _default_out(args: argparse.Namespace) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{run_slug(record_method(args), args.fault)}-{stamp}.json.gz"


def cmd_record(args: argparse.Namespace) -> int:

    from specviz.allocator import keep_freed_memory
    from specviz.engine.models import load_pair
    from specviz.engine.run import RunFailed, RunInterrupted, drafts_with_the_draft_model, run
    from specviz.engine.warm import mark_warm, needs_warm_up
    from specviz.engine.warm import warm_up_run as warm_up
    from specviz.threads import set_threads
    from specviz.trace.columnar import ParquetTraceWriter

    out = Path(args.out) if args.out else _default_out(args)
    check_output_path(out, args.force)
    if (wrong_name := check_trace_name(str(out))) is not None:  # a file the app would then refuse
        raise SpecvizError(f"--out {wrong_name}")
    set_threads(args.threads)  # a run is never lost to a bad --out found afterwards
    keep_freed_memory()  # a short-lived process: reuse freed tensors instead of page-faulting them in
    prompts = record_prompts(args)
    config = run_config(args)
    config.validate()
    pair = load_pair(
        args.target,
        args.draft,
        device=args.device,
        dtype=args.dtype,
        with_draft=drafts_with_the_draft_model(config),
        trust_remote_code=args.trust_remote_code,
    )
    bars: dict[str, Any] = {}
    progress = progress_bars(bars)

    # A Parquet trace is written as the run goes, a row group at a time: never whole in memory.
    sink = ParquetTraceWriter(out) if out.suffix == ".parquet" else None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        # CUDA: time a warm run (the first decode of a process is mostly start-up); the header says so.
        warm_s = warm_up(pair, prompts, config) if needs_warm_up(pair) and not args.no_warm_up else None
        trace = run(pair, prompts, config, progress=progress, steps_to=sink)
        mark_warm(trace, pair, warm_s)
        status = 0
    except RunInterrupted as interrupted:
        trace = interrupted.trace
        status = EXIT_INTERRUPTED
    except RunFailed as failed:  # keep what finished, then report the one-line reason
        out = _keep_complete(out, failed.trace, sink)
        _save(failed.trace, out, sink)
        raise SpecvizError(f"{failed} (partial trace saved to {out})") from None
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        for bar in bars.values():
            bar.close()
    out = _keep_complete(out, trace, sink)
    trace = _save(trace, out, sink)
    _print_summary(trace, out, args.json)
    if status:
        print(f"specviz: interrupted; partial trace ({len(trace.steps)} steps) saved to {out}", file=sys.stderr)
    return status


def _save(trace: Any, out: Path, sink: Any) -> Any:
    """Write the trace to `out`; a run recorded into a Parquet sink is closed there, and the trace
    returned reads its steps back from the file (for the summary) a row group at a time."""
    from specviz.trace.io import open_trace, save_trace

    if sink is None:
        save_trace(trace, out)
        return trace
    sink.close(trace.header, trace.sequences, path=out)
    return open_trace(out)


def _step_count(trace: Any, sink: Any) -> int:
    return sink.steps_written if sink is not None else len(trace.steps)


def _keep_complete(out: Path, trace: Any, sink: Any = None) -> Path:
    """Where to save `trace`: beside `out` when `out` holds a complete trace with more steps.

    `--force` replaces a file, but an interrupted or smaller run must never destroy a complete
    one (Ctrl-C in the reference phase leaves 0 steps): that run goes next to it instead.
    """
    from specviz.trace.io import TraceError, open_trace

    if not out.is_file():
        return out
    try:
        existing = open_trace(out)
    except TraceError:  # not a trace (or not one we read): --force may replace it
        return out
    steps = _step_count(trace, sink)
    if existing.header.complete and len(existing.steps) > steps:
        kept = beside(out, "partial" if not trace.header.complete else "new")
        print(
            f"specviz: {out} holds a complete trace of {len(existing.steps)} steps; this run's "
            f"{steps} steps go to {kept}",
            file=sys.stderr,
        )
        return kept
    return out


def _print_summary(trace: Any, out: Path, as_json: bool) -> None:
    """The run's numbers and its verdict (the first violation too: `record` answers what `check` does).

    Printed through `print_to_pipe`: `specviz record ... --json | head -c 600` ends quietly.
    """
    from specviz.analysis.check import check_trace
    from specviz.analysis.metrics import summary
    from specviz.analysis.notes import run_notes

    info = summary(trace)
    report = check_trace(trace)
    first = report.first_violation
    info["verdict"] = report.verdict
    info["violations"] = report.violation_count
    info["first_violation"] = (
        None
        if first is None
        else {
            "step": first.step,
            "row": first.row,
            "seq_id": first.seq_id,
            "invariant": int(first.invariant),
            "name": first.name,
            "message": first.message,
        }
    )
    info["trace"] = str(out)
    info["proposer"], info["tree_branches"] = trace.header.proposer, trace.header.tree_branches
    info["notes"] = run_notes(trace, report)  # a DESYNC beside exact outputs; a fault that never fired
    if as_json:
        print_to_pipe(json.dumps(info))
        return
    rate = info["acceptance_rate"]
    exact = info["exact_match"]
    lines = [
        f"{run_title(info['method'], info['fault'])}: "
        f"{info['num_prompts']} prompts, batch {info['batch_size']}, k={info['draft_k']}"
        + (f", {info['proposer']}" if info["draft_k"] and info["proposer"] != DEFAULT_PROPOSER else "")
        + (f", tree {info['tree_branches']}" if info["tree_branches"] else ""),
        f"  verdict            {report.verdict.upper()} ({report.violation_count} violations)",
        *(f"  note               {note}" for note in info["notes"]),
    ]
    if first is not None:
        lines.append(
            f"  first violation    step {first.step}, row {first.row} (sequence {first.seq_id}): "
            f"invariant {int(first.invariant)} {first.name}: {first.message}"
        )
    lines.append("  exact match        " + (f"{exact:.3f}" if exact is not None else "n/a (no reference)"))
    if rate is not None:
        lines.append(f"  acceptance rate    {rate:.3f}   mean acceptance length {info['mean_acceptance_length']:.2f}")
    lines.append(
        f"  throughput         {info['tokens_per_second']:.1f} tok/s ({info['tokens_emitted']} tokens, "
        f"{info['decode_seconds']:.2f} s)"
    )
    if info["exspec_group_share"] is not None:
        lines.append(f"  exspec group share {info['exspec_group_share']:.3f}")
    lines.append(f"  trace              {out}")
    print_to_pipe("\n".join(lines))
