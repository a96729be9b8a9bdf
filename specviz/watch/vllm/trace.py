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

# vLLM's speculative method -> the trace's proposer (no speculation: the schema's default); any other drafts with a head
PROPOSERS = {None: "draft-model", "ngram": "ngram", "draft_model": "draft-model"}
REQUESTS = "vllm_requests"  # header.options: seq_id -> vLLM's req_id


def read_records(folder: Path) -> list[dict[str, Any]]:
    """The runner steps recorded under `folder`: one engine's (several engines are refused)."""
    engines = [f for f in sorted(folder.glob("engine-*.jsonl")) if f.stat().st_size]
    if len(engines) > 1:
        raise SpecvizError(f"watch: {len(engines)} vLLM engines ran model steps; one trace holds one engine's run")
    records = [json.loads(line) for f in engines for line in f.read_text(encoding="utf-8").splitlines() if line]
    bad = {r.get("format") for r in records} - {FORMAT}
    if bad:
        raise SpecvizError(f"watch: vLLM records of format {sorted(bad)}; this specviz reads format {FORMAT}")
    return records


def build_trace(records: list[dict[str, Any]], name: str, reference: bool = True, complete: bool = True) -> Trace:
    """The trace of one recorded run; `reference`: decode each request's batch-1 oracle (a greedy run
    that completed only: an interrupted run's requests have no known end)."""
    if not records:
        raise SpecvizError("watch: no vLLM model-runner step was recorded (did the script call LLM.generate?)")
    assembly = assemble(records)
    engine, requests = assembly.engine, assembly.requests
    target, tokenizer = _hf_target(engine["model"]) if engine.get("model") else (None, None)
    greedy = all(r.temperature == 0 for r in requests)
    decode = reference and complete and greedy and target is not None
    references = _references(target, requests) if decode else [(None, None)] * len(requests)
    trace = Trace(
        header=_header(assembly, name, greedy, complete, target),
        steps=assembly.steps,
        sequences=[_sequence(r, tokenizer, references[r.seq]) for r in requests],
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
    """Each request decoded alone to its own budget."""
    from specviz.engine.reference import greedy_reference

    return [greedy_reference(target, r.prompt, r.budget, r.stop_ids) if r.budget else ([], []) for r in requests]


def _sequence(r: Request, tokenizer: Any, reference: tuple[list[int] | None, list[float] | None]) -> SequenceRecord:
    ref_ids, margins = reference
    return SequenceRecord(
        seq_id=r.seq,
        prompt=_text(tokenizer, r.prompt),
        prompt_ids=list(r.prompt),
        output_ids=list(r.output),
        output_text=_text(tokenizer, r.output),
        reference_ids=ref_ids,
        reference_margins=margins,
        finish_reason=r.finish_reason,
    )


def _text(tokenizer: Any, ids: list[int]) -> str:
    return "" if tokenizer is None else tokenizer.decode(ids, skip_special_tokens=False)


def _header(assembly: Assembly, name: str, greedy: bool, complete: bool, target: Any) -> Header:
    from specviz.trace.provenance import library_versions, model_info

    engine = assembly.engine
    run_budget = max((r.budget for r in assembly.requests), default=1)
    said = {  # options written only where they say something: own budgets, notes, where the metadata stops
        BUDGETS: {str(r.seq): r.budget for r in assembly.requests if r.budget != run_budget},
        "watch_notes": assembly.notes[:20],
        UNREADABLE: assembly.unreadable,
    }
    options = {REQUESTS: {str(r.seq): r.req_id for r in assembly.requests}, **{k: v for k, v in said.items() if v}}
    return Header(
        schema_version=SCHEMA_VERSION,
        method="baseline" if assembly.k == 0 else "speculative",
        fault=None,
        target=model_info(target, name=engine["model"]) if target is not None else _unloaded("?"),
        draft=_unloaded(engine["draft_model"]) if engine.get("draft_model") else None,
        proposer=PROPOSERS.get(engine.get("method"), "head"),
        draft_k=assembly.k,
        batch_size=max((len(s.rows) for s in assembly.steps), default=1),
        max_new_tokens=run_budget,
        eos_token_ids=sorted(set().union(*(r.stop_ids for r in assembly.requests))),
        pad_token_id=None,
        seed=0,
        created_at=now_iso(),
        library_versions={**library_versions(), "vllm": engine.get("vllm", "?")},
        engine=name,
        options=options,
        complete=complete,
        finished_at=now_iso(),
        layout="unspecified",
        sampling=None if greedy else SamplingInfo(mode="rejection", temperature=assembly.requests[0].temperature),
    )


def _unloaded(path: str) -> ModelInfo:
    """A model the watch did not load: its path ("?": none recorded), sizes unknown (0)."""
    return ModelInfo(name=path, dtype="?", device="cpu", vocab_size=0, num_parameters=0)
