"""The command line's grammar: every `specviz` command and its arguments (`build_parser`), built
only for the command asked; what each command does is `specviz.cli`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

DESCRIPTION = "`python -m specviz ...`: record a run into a trace, check a trace."
EXIT_BAD_INPUT = 2

CHECK_DESCRIPTION = """\
Check a trace: replay the ragged state of every verify step and report where it first differs
from what a correct engine feeds (each row attends exactly its committed tokens, at their
logical positions; tokens accounted for; plus rectangular alignment for traces that declare the
left-padded layout), and which outputs differ from the target's batch-1 reference.

A trace is the JSON file (.json or .json.gz) one decoding run writes: a header (models, method,
batch size, k), one record per verify step and batch row (positions, attention mask, KV lengths,
drafts, accepted count) and one per prompt (output and reference token IDs, with their text).
`specviz record` writes one; other engines can too (docs/trace-format.md)."""

CHECK_EPILOG = """\
exit status:
  0    clean or numerical: every invariant holds (outputs equal, or differ only at near-ties)
  1    desync or unexplained: an invariant broke, or an output differs with no near-tie
  2    bad input: missing or malformed trace (one line on stderr)
  3    unreadable: a watched run the watch could not map from some step on (no invariant broke
       before it); --json says where and why in its "unreadable" field"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage block is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default, except an unset one (None) or a flag's False, which say nothing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:  # identity: 0 is a default worth showing
            return action.help
        return super()._get_help_string(action)


COMMANDS = {
    "record": "decode prompts and write a trace",
    "check": "check a trace's invariants and outputs",
    "bench": "benchmark exactness and cost of the methods side by side",
    "watch": "run a script with every causal LM it loads watched; write a trace",
    "probe": "A/B an OpenAI-compatible server: batch dependence, bug or floating point",
    "convert": "convert a trace between JSON (.json, .json.gz) and Parquet (.parquet)",
    "runs": "one table of the runs in a folder of traces (a CI history, a sweep)",
    "report": "write a trace's finding as one self-contained HTML file (for a bug ticket)",
    "export": "export a trace for another viewer (--perfetto: Chrome trace-event JSON)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; with `command`, only that subcommand's options are built ("": none).

    Building `record`'s or `bench`'s options imports the engine (and torch, ~1 s and ~200 MB),
    which `check` on a trace file does not need, so `main` builds only the command it runs.
    """
    parser = _Parser(prog="specviz", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, help_text in COMMANDS.items():
        child = sub.add_parser(name, help=help_text)
        if command is None or command == name:
            ADD_ARGUMENTS[name](child)
    return parser


def command_word(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names (its first word that is not an option), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def _add_record(rec: argparse.ArgumentParser) -> None:
    from specviz.engine.faults import FAULTS
    from specviz.engine.methods.grouping import POLICIES
    from specviz.proposers import DEFAULT_PROPOSER, REGISTRY
    from specviz.threads import add_threads_argument
    from specviz.trace.schema import METHODS

    rec.description = (
        "Decode prompts with a speculative method (optionally with a known bug injected) and write "
        "the trace of every verify step, with the text of its tokens."
    )
    rec.formatter_class = _DefaultsFormatter  # every option shows its default
    rec.add_argument(
        "--method",
        choices=list(METHODS),
        default=None,
        help="decoding method (default: eqspec); with --fault, the method docs/faults.md names for the fault",
    )
    rec.add_argument("--fault", choices=sorted(FAULTS), default=None, help="inject a known bug")
    rec.add_argument("--target", default=None, help="target model: local path or hub id (default: embedded)")
    rec.add_argument("--draft", default=None, help="draft model: local path or hub id (default: embedded)")
    rec.add_argument("--batch-size", type=int, default=8, help="rows decoded together")
    rec.add_argument("--draft-k", type=int, default=4, help="draft tokens proposed per verify step")
    rec.add_argument(
        "--proposer",
        choices=list(REGISTRY),
        default=DEFAULT_PROPOSER,
        help="what drafts: " + "; ".join(f"{k.name}: {k.label}" for k in REGISTRY.values()) + " (docs/architecture.md)",
    )
    rec.add_argument("--head", default=None, help="--proposer head: the head's folder (default: embedded)")
    rec.add_argument(
        "--tree",
        type=int,
        default=0,
        metavar="B",
        help="tree verification: B alternative drafts beside the chain of k, verified in one forward "
        "with a tree mask (0: a chain; greedy only; see --tree-kind)",
    )
    rec.add_argument(
        "--tree-kind",
        choices=["static", "topk"],
        default="static",
        help="static: one alternative at each of the first B depths (the proposer's second choice); "
        "topk: per row, the B best-scored alternatives among the proposer's next choices at every "
        "depth (a dynamic tree, EAGLE-2's ranking; a proposer that scores its drafts: "
        + ", ".join(k.name for k in REGISTRY.values() if k.scores)
        + ")",
    )
    rec.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt at most")
    prompts = rec.add_mutually_exclusive_group()
    prompts.add_argument("--num-prompts", type=int, default=None, help="first N SpecBench prompts (None: all)")
    prompts.add_argument("--prompts", default=None, help="JSONL file of prompts")
    rec.add_argument("--device", default="auto", help="auto, cpu or cuda")
    add_threads_argument(rec)
    rec.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16 (CUDA default), float16")
    rec.add_argument("--seed", type=int, default=0, help="also keys the sampling noise at --temperature > 0")
    rec.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: keyed sampling")
    rec.add_argument("--top-p", type=float, default=1.0, help="nucleus filter at --temperature > 0 (1: off)")
    rec.add_argument("--top-k", type=int, default=0, help="top-k filter at --temperature > 0 (0: off)")
    rec.add_argument(
        "--sampling",
        choices=["coupled", "rejection"],
        default="coupled",
        help="coupled: draft and target share keyed noise, token-exact against the sampled reference; "
        "rejection: speculative rejection sampling, distribution-exact only",
    )
    rec.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        metavar="P",
        help="transformers' repetition penalty over the prompt and every emitted token (1: off); greedy "
        "or coupled sampling, chains only",
    )
    rec.add_argument(
        "--prefill-chunk",
        type=int,
        default=0,
        metavar="N",
        help="chunked prefill: contexts go into the caches N tokens at a time, each chunk attending the "
        "earlier ones (0: whole prompts; every method); on exspec a waiting prompt's chunk rides "
        "in the running rows' verify forward; the trace records the chunks and which step carried each",
    )
    rec.add_argument("--window", type=int, default=None, help="exspec sliding window (default 6 x batch)")
    rec.add_argument("--policy", choices=POLICIES, default="converge", help="exspec grouping policy")
    rec.add_argument("--no-reference", action="store_true", help="skip the batch-1 oracle (greedy or sampled)")
    rec.add_argument(
        "--no-warm-up", action="store_true", help="CUDA: time the first (cold) decode; the header says warm: false"
    )
    rec.add_argument(
        "--kv-check-every",
        type=int,
        default=None,
        metavar="N",
        help="recompute and compare the target's layer-0 keys every N steps (1: every step, 0: off; default 16)",
    )
    rec.add_argument("--trust-remote-code", action="store_true", help="let transformers run the model's own code")
    rec.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    rec.add_argument(
        "--out",
        default=None,
        help="trace path (.json, .json.gz, or .parquet: written as the run goes); default runs/<name>.json.gz",
    )
    rec.add_argument(
        "--force", action="store_true", help="overwrite an existing --out file (never a complete trace of more steps)"
    )


def _add_check(chk: argparse.ArgumentParser) -> None:
    chk.description, chk.epilog = CHECK_DESCRIPTION, CHECK_EPILOG
    chk.formatter_class = argparse.RawDescriptionHelpFormatter
    chk.add_argument("trace", help="trace file (.json or .json.gz), e.g. runs/<name>.json.gz from `record`")
    chk.add_argument("--json", action="store_true", help="print the report and metrics as one JSON object")
    _add_no_limits(chk)


def _add_bench(bench: argparse.ArgumentParser) -> None:
    from specviz.bench import add_arguments

    add_arguments(bench)


def _add_watch(watch: argparse.ArgumentParser) -> None:
    from specviz.watch.cli import add_arguments

    add_arguments(watch)


def _add_probe(probe: argparse.ArgumentParser) -> None:
    from specviz.probe.cli import add_arguments

    add_arguments(probe)


def _add_convert(conv: argparse.ArgumentParser) -> None:
    conv.description = (
        "Convert a trace between the JSON container (.json, .json.gz: the interchange format, and what "
        "the app's upload accepts) and the Parquet container (.parquet: big runs; `check` streams it). "
        "The output's container follows its suffix; the input's is read off its content."
    )
    conv.add_argument("input", help="trace to read (.json, .json.gz or .parquet)")
    conv.add_argument("output", help="trace to write (.json, .json.gz or .parquet)")
    conv.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _add_no_limits(conv)


def _add_runs(runs: argparse.ArgumentParser) -> None:
    runs.description = (
        "Check every trace in a folder (.json, .json.gz by name; Parquet by content) as `check` does and "
        "print one line per run: method, models, verdict, first violation, exact match, acceptance. A file "
        "that cannot be read or checked is a line with its one-line error. Exit 0 when the table is "
        "printed, 2 for a missing folder or bad options."
    )
    runs.add_argument("folder", metavar="DIR", help="folder of traces")
    runs.add_argument("--recursive", action="store_true", help="also the traces in its subfolders")
    out = runs.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print every column as one JSON object")
    out.add_argument("--csv", metavar="FILE", help="write every column to FILE as CSV")
    runs.add_argument("--force", action="store_true", help="overwrite an existing --csv file")
    runs.add_argument("--sort", metavar="COLUMN", default="file", help="sort by this column (JSON names)")
    runs.add_argument("--reverse", action="store_true", help="sort in descending order (unknowns stay last)")
    _add_no_limits(runs)
    runs.add_argument(
        "--cache", metavar="FILE", help="keep rows in FILE; unchanged files (path, size, mtime) are not re-checked"
    )
    runs.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="files done / total on stderr (default: only when stderr is a terminal)",
    )


def _add_no_limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-limits",
        action="store_true",
        help="read a trusted big trace whose parts decode past the limits a file may declare "
        "(see docs/space.md: a crafted file is refused in one line otherwise)",
    )


def _add_report(rep: argparse.ArgumentParser) -> None:
    rep.description = (
        "Check a trace and write its finding as one HTML file that opens with no server and no network: "
        "the verdict, the first violation, the ragged grid at that step, the violating row's fed vs expected, "
        "the divergent outputs beside the reference, and the check's JSON. Exit 0 when written (whatever "
        "the verdict), 2 for bad input."
    )
    rep.add_argument("trace", help="trace file (.json, .json.gz or .parquet)")
    rep.add_argument("-o", "--out", default=None, help="HTML file to write (default: the trace's name + .html)")
    rep.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _add_no_limits(rep)


def _add_export(exp: argparse.ArgumentParser) -> None:
    exp.description = (
        "Export a trace for another viewer. --perfetto writes Chrome trace-event JSON that Perfetto's UI "
        "(ui.perfetto.dev, opened from a file: nothing is uploaded) opens: a track per "
        "batch row, a slice per step phase (draft, verify, align) with its recorded duration, and the row's "
        "accepted count, positions, KV length and violations as the verify slice's args (docs/app.md)."
    )
    exp.add_argument("trace", help="trace file (.json, .json.gz or .parquet)")
    exp.add_argument("--perfetto", action="store_true", required=True, help="Chrome trace-event JSON (the only format)")
    exp.add_argument("-o", "--out", default=None, help="file to write (default: the trace's name + .perfetto.json)")
    exp.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _add_no_limits(exp)


ADD_ARGUMENTS = {
    "record": _add_record,
    "check": _add_check,
    "bench": _add_bench,
    "watch": _add_watch,
    "probe": _add_probe,
    "convert": _add_convert,
    "runs": _add_runs,
    "report": _add_report,
    "export": _add_export,
}
