"""`specviz probe URL_A [URL_B]`: is a greedy answer that changes with the batch a bug or floating
point? Arguments, the run with a progress bar on stderr, and the text summary."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specviz.probe import report as rp
from specviz.probe.locate import ENGINES

DESCRIPTION = """\
Black-box A/B of OpenAI-compatible servers (vLLM, SGLang, llama.cpp, transformers serve, ...),
greedy (temperature 0), token by token. One URL: each prompt alone (concurrency 1) against the
prompts sent together (--concurrency N, so the server batches them). Two URLs: server A against
server B at --concurrency. --concurrency 1,2,4,8,16 sweeps levels, each against level 1;
--rounds R repeats the workload to find rare corruption. Each divergence is numerical (the
reference's margin at the divergent token is within the noise the shared prefixes show, and the
prompt does not stand out), suspect, or unattributed (no logprobs: pass --logprobs, or --replay
MODEL). Drafted tokens a speculative server returns without a logprob are counted and left out;
the acceptance the server reports is compared across levels, per draft position where the
server counts it. --distinct N sends N copies of each prompt together and expects one answer. A
failed run against vLLM (or --engine transformers) comes with the command that replays it
offline under the watch. See docs/probe.md."""

EPILOG = """\
exit status:
  0    identical or numerical: no prompt is suspect or unattributed, acceptance held
  1    suspect (some divergence exceeds the noise, or a prompt stands out), or unattributed,
       or acceptance collapsed under concurrency, overall or at one draft position (even with
       every answer identical), or (--distinct) copies of one prompt got different answers
  2    bad input or an unreachable server (one line on stderr)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description, parser.epilog = DESCRIPTION, EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url_a", metavar="URL_A", help="server base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("url_b", metavar="URL_B", nargs="?", default=None, help="a second server (A/B mode)")
    parser.add_argument("--model", default=None, help="model name to request (default: the first /v1/models lists)")
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    prompts = parser.add_mutually_exclusive_group()
    prompts.add_argument("--prompts", default=None, help='JSONL: {"prompt": ...} or {"messages": [...]} per line')
    prompts.add_argument("--num-prompts", type=int, default=None, help="first N SpecBench prompts (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer at most (default 64)")
    parser.add_argument(
        "--concurrency", type=_levels, default=(8,), metavar="N[,N...]",
        help="requests in flight together (default 8); a list (1,2,4,8,16) sweeps each level against level 1",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole workload R times (default 1)")
    parser.add_argument(
        "--metrics", choices=["auto", "on", "off"], default="auto",
        help="read the server's /metrics spec-decode counters around each pass (default auto: when it has them)",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate", type=int, default=4, metavar="N",
        help="where a side drafts: N shared positions per prompt sent again as a prompt to both servers, "
        "measuring the verify path's noise (default 4, 0: off; docs/probe.md)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="repeats of the concurrent pass (default 1)")
    parser.add_argument("--logprobs", type=int, default=5, help="top logprobs asked per token, 0: none (default 5)")
    parser.add_argument("--replay", default=None, metavar="MODEL_PATH", help="recompute logprobs locally at batch 1")
    parser.add_argument("--replay-dtype", default="float32", help="--replay's dtype; the server's (default float32)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    parser.add_argument("--retries", type=int, default=2, help="retries of a failed request (default 2)")
    parser.add_argument(
        "--engine", choices=ENGINES, default="auto",
        help="the server's engine, for the offline replay command of a failed run (auto: what /v1/models says)",
    )  # fmt: skip
    parser.add_argument(
        "--server-args", default="", metavar="FLAGS",
        help="flags the server was started with that its API does not say (dtype, speculative config, cache), "
        "passed to the replay command",
    )  # fmt: skip
    parser.add_argument(
        "--distinct", type=int, default=None, metavar="N",
        help="send N identical copies of each prompt together (one batch): more than one answer is a finding",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", default=None, help="write the report (JSON) to this file")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number or a list such as 1,2,4,8,16") from None
    return levels


def cmd_probe(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specviz.files import check_output_path
    from specviz.probe.config import ProbeConfig
    from specviz.probe.prompts import load_prompts
    from specviz.probe.runner import run_probe

    out = Path(args.out) if args.out else None
    if out is not None:
        check_output_path(out, args.force)
    num = args.num_prompts if args.num_prompts is not None or args.prompts else 32
    prompts = load_prompts(args.prompts, num)
    config = ProbeConfig(
        url_a=args.url_a,
        url_b=args.url_b,
        endpoint=args.endpoint,
        model=args.model,
        max_tokens=args.max_tokens,
        concurrency=max(args.concurrency),
        levels=args.concurrency if len(args.concurrency) > 1 else None,
        rounds=args.rounds,
        metrics=args.metrics,
        calibrate=args.calibrate,
        repeats=args.repeats,
        logprobs=args.logprobs,
        replay=args.replay,
        replay_dtype=args.replay_dtype,
        timeout_s=args.timeout,
        retries=args.retries,
    )
    config.validate()
    api_key = os.environ.get(args.api_key_env) or None
    if args.distinct is not None:
        return _distinct(args, config, prompts, api_key, out)
    bar = None if args.quiet else tqdm(total=0, unit="req", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        report = run_probe(config, prompts, api_key, progress)
    finally:
        if bar is not None:
            bar.close()
    report = _locate(report, config, args, num, api_key, out)
    if out is not None:
        rp.save_report(report, out)
    from specviz.console import print_to_pipe

    print_to_pipe(json.dumps(rp.to_dict(report)) if args.json else render(report, out))
    return 1 if report.failed else 0


def _distinct(args: argparse.Namespace, config, prompts, api_key: str | None, out: Path | None) -> int:
    """--distinct N: copies of each prompt sent together; one answer expected (probe.distinct)."""
    import dataclasses

    from specviz.console import print_to_pipe
    from specviz.probe import distinct
    from specviz.probe.client import Client, Endpoint, InFlightClock, redact

    if config.url_b is not None:
        raise ValueError("--distinct sends copies to one server: give one URL")
    end = Endpoint.parse(config.url_a)
    side = Client(
        end, config.endpoint, config.model, config.max_tokens, config.logprobs, api_key, InFlightClock(),
        config.timeout_s, config.retries,
    )  # fmt: skip
    try:
        side.model = side.model or side.discover_model()
        report = distinct.run_distinct(side, prompts, args.distinct, redact(end.url))
    finally:
        side.close()
    payload = json.dumps(dataclasses.asdict(report), ensure_ascii=False)
    if out is not None:
        out.write_text(payload + "\n", encoding="utf-8")
    print_to_pipe(payload if args.json else distinct.render(report) + (f"\nreport: {out}" if out else ""))
    return 1 if report.failed else 0


def _locate(report: rp.ProbeReport, config, args: argparse.Namespace, num: int, api_key: str | None, out):
    """A failed run against an engine specviz can run gets the command that replays it offline
    under the watch (specviz.probe.locate); where the server does not say which engine, none."""
    from specviz.probe import locate
    from specviz.probe.client import Client, Endpoint, InFlightClock, ServerError

    if not report.failed or args.engine == "none":
        return report
    url = config.url_b or config.url_a
    side = Client(Endpoint.parse(url), config.endpoint, report.side_b.model, 1, 0, api_key, InFlightClock(), 10.0, 0)
    try:
        command = locate.attach(report, side, args.engine, (args.prompts, num), args.server_args, out)
    except ServerError:
        command = None  # the run is over; an answer it cannot give now only costs the suggestion
    finally:
        side.close()
    return locate.with_command(report, command, out)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _acceptance(a: rp.Acceptance | None) -> str:
    if a is None:
        return "not reported"
    if a.unreadable and a.rate is None:
        return f"unreadable ({a.unreadable})"
    bad = f", unreadable: {a.unreadable}" if a.unreadable else ""
    length = "" if a.mean_length is None else f"mean acceptance length {a.mean_length:.2f}"
    if a.rate is None:
        return f"{length or 'nothing drafted'} ({a.source}; drafted tokens not reported){bad}"
    rate = f"{a.rate:.2f} [{a.low:.2f}, {a.high:.2f}] of {a.drafted} drafted"
    return f"{rate} ({a.source})" + (f", {length}" if length else "") + bad


def _position_lines(report: rp.ProbeReport) -> list[str]:
    """Acceptance per draft position, per side or level, where the server counted it."""
    from specviz.probe.positions import line, shown

    rows = [f"  {name}: {line(a.positions)}" for name, a in shown(report)]
    if not rows:
        return []
    return ["acceptance per draft position (rounds accepted through it; in brackets given the one before):", *rows]


def render(report: rp.ProbeReport, out: Path | None = None, shown: int = 10) -> str:
    from specviz.probe.advice import placeholder_line

    a, b = report.side_a, report.side_b
    n = report.noise
    lines = [
        f"probe: {a.label} ({a.url}, concurrency {a.concurrency}) vs {b.label} "
        f"({b.url}, concurrency {b.concurrency}), {len(report.prompts)} prompts, {report.endpoint}"
        + (f", {report.rounds} rounds" if report.rounds > 1 else ""),
        f"verdict: {report.verdict.upper()}   "
        + "  ".join(f"{k} {v}" for k, v in report.counts.items())
        + (f"   nondeterministic {report.nondeterministic}" if report.repeats > 1 else ""),
    ]
    if report.collapse is not None:
        lines.append(f"ACCEPTANCE COLLAPSE at concurrency {report.collapse.concurrency}: {report.collapse.detail}")
    lines.append(
        f"noise ({n.source}): {_num(n.estimate)}, the largest shared-token margin change on prompts that do not "
        f"stand out (typical {_num(n.typical)}; a prompt stands out when its median change exceeds {_num(n.cut)}"
        + (f" or its largest {_num(n.cut_max)}" if n.cut_max is not None else "")
        + f"; {n.prompts} measured)"
    )
    if len(n.paths) > 1:
        lines.append(
            "  by path: "
            + "; ".join(
                f"{p.path} {p.prompts} prompts, noise {_num(p.estimate)}" + (" (pooled cuts)" if p.pooled else "")
                for p in n.paths
            )
        )
    if n.source == "replay":
        lines.append(
            "  (measured on the local --replay model: its batch-shape noise, not the server's batching numerics; "
            "--engine vllm|transformers gives a failed run the command that replays the prompts through the "
            "server's own engine under the watch)"
        )
    if n.calibration is not None:
        c = n.calibration
        lines.append(
            f"  calibration, {c.source}: {c.prompts} comparisons, largest change {_num(c.largest)}, "
            f"largest median {_num(c.typical)} (no prompt stands out by less)"
        )
    if n.pairs:
        lines.append(
            "  by compute path (side A/side B): "
            + "; ".join(
                f"{p.pair} {_num(p.estimate)} on {p.tokens} tokens of {p.prompts} prompts ({p.source})"
                + ("" if p.measured else ", too few to judge")
                for p in n.pairs
            )
        )
    if n.batch_cut is not None:
        lines.append(
            f"  batch calibration, prompts sent as batches of copies of themselves: no prompt needs more than a "
            f"median change of {_num(n.batch_cut)} or a largest of {_num(n.batch_cut_max)} to stand out"
        )
    for side, name in ((a, "A"), (b, "B")):
        line = placeholder_line(side, name)
        if line:
            lines.append(line)
    if a.acceptance is not None or b.acceptance is not None:
        lines.append(f"acceptance: side A {_acceptance(a.acceptance)}; side B {_acceptance(b.acceptance)}")
    lines.extend(_position_lines(report))
    if report.levels:
        lines.append("concurrency  diverged (95% interval)   identical/numerical/unattributed/suspect   acceptance")
        for v in report.levels:
            counts = "/".join(str(v.counts.get(k, 0)) for k in rp.VERDICTS)
            flag = "  COLLAPSE" if v.collapse else ""
            lines.append(
                f"  {v.concurrency:<10} {v.diverged}/{v.comparisons} [{v.low:.2f}, {v.high:.2f}]".ljust(40)
                + f" {counts:<20} {_acceptance(v.acceptance)}{flag}"
            )
    worst = sorted(
        (p for p in report.prompts if p.verdict != "identical" or p.stands_out or p.findings),
        key=lambda p: (-rp.VERDICTS.index(p.verdict), p.index),
    )
    for p in worst[:shown]:
        where = f"{p.unit} {p.divergence}" if p.divergence is not None else "-"
        ta = repr(p.token_a.text) if p.token_a else "-"
        tb = repr(p.token_b.text) if p.token_b else "-"
        rounds = f" (diverged in {p.diverged_rounds} of {p.rounds} rounds)" if p.rounds > 1 else ""
        lines.append(f"  #{p.index:<5} {p.verdict:<12} at {where}: {ta} vs {tb}; {p.reason}{rounds}")
        lines.extend(f"         {f.kind}: {f.detail}" for f in p.findings)
    if len(worst) > shown:
        lines.append(f"  ... {len(worst) - shown} more (--json or --out for all)")
    t = report.timing
    lines.append(
        f"time: {t.wall_s:.2f} s, server busy {t.server_busy_s:.2f} s, probe overhead {t.overhead_s:.3f} s "
        f"({100 * t.overhead_fraction:.1f}%), {t.requests} requests"
        + (f", replay {t.replay_s:.2f} s" if report.replay else "")
    )
    lines.extend(f"next: {step}" for step in report.next_steps)
    if report.replay_command is not None:
        lines.append(f"  (replay: {report.replay_command.note})")
    if out is not None:
        lines.append(f"report: {out}")
    return "\n".join(lines)
