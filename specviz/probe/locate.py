"""From suspect to located: the one command that replays a flagged probe run offline, under the
watch, through the engine the server runs (vLLM, or transformers' continuous batching).

The probe sees a server from outside: it can say that answers or acceptance change with the
batch, not where in the engine. specviz can run these two engines itself, and the watch reads
their batches step by step (the batch map, the first (step, request) that broke). So a suspect,
unattributed or collapsed run comes with `specviz watch --out T -- python -m
specviz.probe.offline ENGINE ...`: the same prompts, loaded the same way, greedy, the same
`max_tokens`, at most the flagged level's concurrency in one batch, and the server's own flags
(`--server-args`: what the HTTP API cannot say, such as the dtype or the speculative config).

Which engine: `--engine` names it, or `auto` reads `/v1/models` (vLLM says `owned_by: vllm` and
the model's local `root`); `transformers serve` does not say who it is, so it must be named.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from specviz.probe import report as rp
from specviz.probe.client import Client

ENGINES = ("auto", "vllm", "transformers", "none")
MAX_FOCUS = 64  # flagged prompts named in the command at most
LIMITS = (
    "the replay batches the prompts with its own scheduler, not as the server's requests arrived over HTTP: "
    "a bug that needs the server's exact batch composition or timing may not recur, and a clean replay says "
    "nothing about the server's own batches"
)


def identify(side: Client, engine: str) -> tuple[str | None, str | None]:
    """(engine, model path) of the server behind `side`: the named engine, or vLLM where its
    `/v1/models` says so (`auto`; `transformers serve` does not say who it is); None where
    nothing says."""
    if engine == "none":
        return None, None
    card = side.model_card()
    path = (card.get("root") if isinstance(card.get("root"), str) else None) or side.model
    if engine == "auto":
        engine = "vllm" if card.get("owned_by") == "vllm" else "none"
    return (engine, path) if engine != "none" and path else (None, None)


def flagged(report: rp.ProbeReport) -> tuple[tuple[int, ...], int]:
    """(the prompts to watch for, the batch limit) of a failed run: the suspect and unattributed
    prompts at the worst level, or, for a collapse alone, none singled out at the level it began."""
    prompts = tuple(p.index for p in report.prompts if p.verdict in ("suspect", "unattributed"))
    if prompts:
        return prompts, report.side_b.concurrency
    assert report.collapse is not None
    return (), report.collapse.concurrency  # a collapse is every prompt's: none singled out


def replay_command(
    report: rp.ProbeReport,
    engine: str,
    model: str,
    source: tuple[str | None, int],  # (--prompts FILE, or None; --num-prompts)
    server_args: str,
    trace: str,
) -> rp.ReplayCommand:
    prompts, limit = flagged(report)
    file, num = source
    words = ["specviz", "watch", "--out", trace, "--", "python", "-m", "specviz.probe.offline", engine]
    words += ["--model", model, *(["--prompts", file] if file else ["--num-prompts", str(num)])]
    words += ["--max-tokens", str(report.max_tokens), "--max-num-seqs", str(limit)]
    if prompts:  # marks in the replay's output; the report lists them all
        words += ["--focus", ",".join(map(str, prompts[:MAX_FOCUS]))]
    command = shlex.join(words) + (f" {server_args}" if server_args else "")
    notes = [LIMITS]
    if not server_args:
        notes.append(
            "no --server-args: the replay uses the engine's defaults where the server's flags (dtype, speculative "
            "config, cache) are not readable over HTTP; pass them to the probe as --server-args '...'"
        )
    if report.endpoint == "chat":
        notes.append("chat prompts are replayed as plain text (the server's chat template is not applied)")
    if engine == "vllm":
        notes.append("run it in the environment where vLLM is installed (docs/vllm.md)")
    return rp.ReplayCommand(engine, command, prompts, limit, "; ".join(notes))


def attach(
    report: rp.ProbeReport,
    side: Client,
    engine: str,
    source: tuple[str | None, int],
    server_args: str,
    out: Path | None,
) -> rp.ReplayCommand | None:
    """The replay command for a failed run against a server specviz can run (None otherwise)."""
    if not report.failed or engine == "none":
        return None
    name, model = identify(side, engine)
    if name is None or model is None:
        return None
    trace = str(out.with_name(out.stem + ".replay.trace.json")) if out is not None else "probe-replay.trace.json"
    return replay_command(report, name, model, source, server_args, trace)


def with_command(report: rp.ProbeReport, command: rp.ReplayCommand | None, out: Path | None) -> rp.ProbeReport:
    """The report with its replay command, and a last next step: run it, then open both."""
    if command is None:
        return report
    trace = shlex.split(command.command)[3]
    app = shlex.join(["python", "app.py", "--trace", trace, "--probe", str(out) if out else "REPORT.json"])
    step = f"locate it: {command.command} ; then see the report beside the replay's trace: {app}"
    if out is None:
        step += " (save the report with --out)"
    return dataclasses.replace(report, replay_command=command, next_steps=(*report.next_steps, step))
