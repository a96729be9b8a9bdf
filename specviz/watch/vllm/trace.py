"""The records of a vLLM run -> a specviz trace: one sequence per request, one step per runner step.

The records come from every vLLM process that ran a model runner (`engine-<pid>.jsonl` under one
folder); one process is one engine. The oracle is the target decoded alone, batch 1, greedy, by
Hugging Face transformers outside vLLM (`specviz.engine.reference.greedy_reference`), each
request to its own budget: vLLM's batching, paging and speculation play no part in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specviz.analysis.budgets import BUDGETS
from specviz.analysis.unread import UNREADABLE
from specviz.errors import SpecvizError
from specviz.trace.naming import now_iso
from specviz.trace.schema import SCHEMA_VERSION, Header, ModelInfo, SamplingInfo, SequenceRecord, Trace
from specviz.watch.vllm.capture import FORMAT
from specviz.watch.vllm.steps import Assembly, Request, assemble

PROPOSERS = {"ngram": "ngram", "draft_model": "draft-model"}  # any other method drafts with a head
REQUESTS = "vllm_requests"  # header.options: seq_id -> vLLM's req_id


def read_records(folder: Path) -> list[dict[str, Any]]:
    """The runner steps recorded under `folder`: one engine's (several engines are refused)."""
    files = sorted(folder.glob("engine-*.jsonl"))
    engines = [f for f in files if f.stat().st_size]
    if len(engines) > 1:
        raise SpecvizError(f"watch: {len(engines)} vLLM engines ran model steps; one trace holds one engine's run")
    if not engines:
        return []
    records = [json.loads(line) for line in engines[0].read_text(encoding="utf-8").splitlines() if line]
    bad = {r.get("format") for r in records} - {FORMAT}
    if bad:
        raise SpecvizError(f"watch: vLLM records of format {sorted(bad)}; this specviz reads format {FORMAT}")
    return records


def build_trace(records: list[dict[str, Any]], name: str, reference: bool = True, complete: bool = True) -> Trace:
    """The trace of one recorded run; `reference`: decode each request's batch-1 oracle."""
    if not records:
        raise SpecvizError("watch: no vLLM model-runner step was recorded (did the script call LLM.generate?)")
    engine = records[0].get("engine") or {}
    assembly = assemble(records)
    tokenizer = target = None
    if engine.get("model"):
        target, tokenizer = _hf_target(engine["model"])
    greedy = all(r.temperature == 0 for r in assembly.requests)
    references = _references(target, assembly.requests) if reference and greedy and target is not None else None
    sequences = [_sequence(r, tokenizer, references) for r in assembly.requests]
    trace = Trace(
        header=_header(engine, assembly, name, greedy, complete, target), steps=assembly.steps, sequences=sequences
    )
    if tokenizer is not None:
        from specviz.trace.token_text import attach_token_text

        attach_token_text(trace, tokenizer)
    return trace


def _hf_target(path: str) -> tuple[Any, Any]:
    """The target as Hugging Face loads it (float32, CPU), with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _references(target: Any, requests: list[Request]) -> list[tuple[list[int], list[float]]]:
    """Each request decoded alone to its own budget (its length where it ended by length)."""
    from specviz.engine.reference import greedy_reference

    out = []
    for r in requests:
        budget = len(r.output) if r.finish_reason == "length" else (r.max_tokens or len(r.output))
        out.append(greedy_reference(target, r.prompt, max(budget, 1), r.stop_ids) if budget else ([], []))
    return out


def _sequence(r: Request, tokenizer: Any, references: list[tuple[list[int], list[float]]] | None) -> SequenceRecord:
    ref_ids, margins = references[r.seq] if references is not None else (None, None)
    text = (lambda ids: tokenizer.decode(ids, skip_special_tokens=False) if ids else "") if tokenizer else str
    return SequenceRecord(
        seq_id=r.seq,
        prompt=text(r.prompt) if tokenizer else "",
        prompt_ids=list(r.prompt),
        output_ids=list(r.output),
        output_text=text(r.output) if tokenizer else "",
        reference_ids=ref_ids,
        reference_margins=margins,
        finish_reason=r.finish_reason,
    )


def _header(engine: dict[str, Any], assembly: Assembly, name: str, greedy: bool, complete: bool, target: Any) -> Header:
    from specviz.trace.provenance import library_versions, model_info

    budgets = [r.max_tokens or len(r.output) for r in assembly.requests]
    run_budget = max(budgets, default=1)
    options: dict[str, Any] = {REQUESTS: {str(r.seq): r.req_id for r in assembly.requests}}
    own = {str(r.seq): b for r, b in zip(assembly.requests, budgets) if b != run_budget}
    if own:
        options[BUDGETS] = own
    if assembly.notes:
        options["watch_notes"] = assembly.notes[:20]
    if assembly.unreadable is not None:
        options[UNREADABLE] = {"step": assembly.unreadable[0], "why": assembly.unreadable[1]}
    versions = library_versions()
    versions["vllm"] = engine.get("vllm", "?")
    method = engine.get("method")
    eos = sorted(set().union(*(r.stop_ids for r in assembly.requests))) if assembly.requests else []
    return Header(
        schema_version=SCHEMA_VERSION,
        method="baseline" if assembly.k == 0 else "speculative",
        fault=None,
        target=model_info(target, name=engine["model"]) if target is not None else _unloaded(engine.get("model")),
        draft=_unloaded(engine["draft_model"]) if engine.get("draft_model") else None,
        proposer=PROPOSERS.get(method, "head") if method else "draft-model",
        draft_k=assembly.k,
        batch_size=max((len(s.rows) for s in assembly.steps), default=1),
        max_new_tokens=run_budget,
        eos_token_ids=eos,
        pad_token_id=None,
        seed=0,
        created_at=now_iso(),
        library_versions=versions,
        engine=name,
        options=options,
        complete=complete,
        finished_at=now_iso(),
        layout="unspecified",
        sampling=None if greedy else SamplingInfo(mode="rejection", temperature=assembly.requests[0].temperature),
    )


def _unloaded(path: str | None) -> ModelInfo:
    """A model the watch did not load: its path, sizes unknown (0)."""
    return ModelInfo(name=path or "?", dtype="?", device="cpu", vocab_size=0, num_parameters=0)
