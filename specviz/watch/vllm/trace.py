"""The records of a vLLM run -> a specviz trace: one sequence per request, one step per runner step. The
records come from the one vLLM process that ran a model runner (`engine-<pid>.jsonl`). The oracle is the
target decoded alone, batch 1, greedy, by Hugging Face transformers, each request to its own budget."""

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
from specviz.watch.vllm.steps import PROPOSERS, Assembly, assemble

REQUESTS = "vllm_requests"  # header.options: seq_id -> vLLM's req_id


def read_records(folder: Path) -> list[dict[str, Any]]:
    """The runner steps recorded under `folder`: one engine's (several engines are refused)."""
    engines = sorted(folder.glob("engine-*.jsonl"))  # only a process whose runner ran a step writes one
    if len(engines) > 1:
        raise SpecvizError(f"watch: {len(engines)} vLLM engines ran model steps; one trace holds one engine's run")
    records = [json.loads(line) for f in engines for line in f.read_text(encoding="utf-8").splitlines()]
    bad = {r.get("format") for r in records} - {FORMAT}
    if bad:
        raise SpecvizError(f"watch: vLLM records of format {sorted(bad)}; this specviz reads format {FORMAT}")
    return records


def build_trace(records: list[dict[str, Any]], name: str, reference: bool = True, complete: bool = True) -> Trace:
    """The trace of one run; `reference`: each request's batch-1 oracle (greedy, completed runs only)."""
    if not records:
        raise SpecvizError("watch: no vLLM model-runner step was recorded (did the script call LLM.generate?)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specviz.engine.reference import greedy_reference
    from specviz.trace.token_text import attach_token_text

    assembly = assemble(records)
    requests, path = assembly.requests, assembly.engine["model"]
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # as Hugging Face loads it
    tokenizer = AutoTokenizer.from_pretrained(path)
    greedy = all(r.temperature == 0 for r in requests)
    references = [(None, None)] * len(requests)
    if reference and complete and greedy:  # each request decoded alone to its own budget
        references = [
            greedy_reference(target, r.prompt, r.budget, r.stop_ids, min_new_tokens=r.min_tokens) for r in requests
        ]
    sequences = [
        SequenceRecord(
            r.seq, tokenizer.decode(r.prompt), r.prompt, r.output, tokenizer.decode(r.output), *ref, r.finish_reason
        )
        for r, ref in zip(requests, references)
    ]
    trace = Trace(header=_header(assembly, name, greedy, complete, target), steps=assembly.steps, sequences=sequences)
    return attach_token_text(trace, tokenizer)


def _header(assembly: Assembly, name: str, greedy: bool, complete: bool, target: Any) -> Header:
    from specviz.trace.provenance import library_versions, model_info

    engine, requests = assembly.engine, assembly.requests
    run_budget = max((r.budget for r in requests), default=1)
    said = {  # options written only where they say something: own budgets, notes, where the metadata stops
        BUDGETS: {str(r.seq): r.budget for r in requests if r.budget != run_budget},
        "watch_notes": assembly.notes[:20],
        UNREADABLE: assembly.unreadable,
    }
    options = {REQUESTS: {str(r.seq): r.req_id for r in requests}, **{k: v for k, v in said.items() if v}}
    return Header(
        schema_version=SCHEMA_VERSION,
        method="baseline" if assembly.k == 0 else "speculative",
        fault=None,
        target=model_info(target, name=engine["model"]),
        draft=ModelInfo(engine["draft_model"], "?", "cpu", 0, 0) if engine["draft_model"] else None,  # not loaded
        proposer=PROPOSERS.get(engine["method"], "head"),
        draft_k=assembly.k,
        batch_size=max((len(s.rows) for s in assembly.steps), default=1),
        max_new_tokens=run_budget,
        eos_token_ids=sorted(set().union(*(r.stop_ids for r in requests))),
        pad_token_id=None,
        seed=0,
        created_at=now_iso(),
        library_versions={**library_versions(), "vllm": engine["vllm"]},
        engine=name,
        options=options,
        complete=complete,
        finished_at=now_iso(),
        layout="unspecified",
        sampling=None if greedy else SamplingInfo(mode="rejection", temperature=requests[0].temperature),
    )
