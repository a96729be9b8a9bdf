"""What `Watch.close` writes besides the steps: the trace's header (what was declared, what was
read, why a run is unreadable from some step), each sequence's record, and its batch-1 greedy
reference (the oracle), decoded with the target to the sequence's own budget. `w` is the `Watch`."""

from __future__ import annotations

from typing import Any

from specviz.analysis.budgets import BUDGETS
from specviz.analysis.findings import UNREADABLE
from specviz.engine.reference import greedy_reference
from specviz.trace.naming import now_iso
from specviz.trace.provenance import library_versions, model_info
from specviz.trace.schema import SCHEMA_VERSION, Header, SamplingInfo, SequenceRecord
from specviz.watch.declared import pad_id
from specviz.watch.steps import InferredSteps
from specviz.watch.tree import alternatives as tree_alternatives


def header(w: Any, assembly: InferredSteps, eos: frozenset[int], complete: bool) -> Header:
    seconds = None
    if assembly.first_call_at is not None:  # a call, so an event: last_event_at is set too
        seconds = round(assembly.last_event_at - assembly.first_call_at, 6)
    unreadable = assembly.unreadable
    options = {
        "watch_notes": assembly.notes[:20],
        # The check's verdict: unreadable from step S.
        UNREADABLE: None if unreadable is None else {"step": unreadable[0], "why": unreadable[1]},
        # A budget per sequence: the check judges each "length" ending against its own.
        BUDGETS: {str(s): n for s, n in assembly.budgets.items() if n != assembly.max_new_tokens},
        "logits_processed": w.logits_processed,  # declared: the engine chose on processed logits
    }
    return Header(
        schema_version=SCHEMA_VERSION,
        method="baseline" if assembly.k == 0 else "speculative",
        fault=None,
        target=model_info(w.target),
        draft=model_info(w.draft) if w.draft is not None and assembly.k > 0 else None,
        # A named head drafted (rows record `head_source` where its input was found).
        proposer="head" if w._head_named and assembly.k > 0 and w.draft is None else "draft-model",
        draft_k=assembly.k,
        tree_branches=tree_alternatives(assembly.steps),
        batch_size=max((len(s.rows) for s in assembly.steps), default=1) or 1,
        max_new_tokens=assembly.max_new_tokens,
        eos_token_ids=sorted(eos),
        pad_token_id=pad_id(w.target, w.tokenizer),
        seed=0,
        created_at=w.created_at,
        library_versions=library_versions(),
        engine=w.name,
        options={key: value for key, value in options.items() if value},  # only what was said or found
        complete=complete,
        finished_at=now_iso(),
        decode_seconds=seconds,
        layout=w.layout,
        # Declared sampling: speculative rejection sampling keeps the accounting (accepted
        # drafts, then one sample) but asks no token equality with an oracle.
        sampling=SamplingInfo(mode="rejection", temperature=w.temperature) if w.temperature > 0 else None,
    )


def references(
    w: Any, prompts: list[list[int]], assembly: InferredSteps, eos: frozenset[int]
) -> list[tuple[list[int], list[float]]]:
    """Each sequence's batch-1 greedy reference, to its own budget (its length where it ended
    by "length", else the run's)."""
    was_training = w.target.training
    w.target.eval()
    budget = assembly.budgets.get
    try:
        return [
            greedy_reference(w.target, ids, budget(s, assembly.max_new_tokens), eos) for s, ids in enumerate(prompts)
        ]
    finally:
        w.target.train(was_training)


def sequences(
    w: Any, prompts: list[list[int]], assembly: InferredSteps, references: list[tuple[Any, Any]]
) -> list[SequenceRecord]:
    """`references`: each sequence's (ids, margins), (None, None) where none was decoded."""
    outputs = [assembly.outputs.get(seq_id, []) for seq_id in range(len(prompts))]
    return [
        SequenceRecord(
            seq_id=seq_id,
            prompt=w.prompt_texts[seq_id] if w.prompt_texts else _decode(w, ids),
            prompt_ids=list(ids),
            output_ids=list(output),
            output_text=_decode(w, output),
            reference_ids=ref_ids,
            reference_margins=margins,
            finish_reason=assembly.finish_reasons.get(seq_id),
        )
        for seq_id, (ids, output, (ref_ids, margins)) in enumerate(zip(prompts, outputs, references))
    ]


def _decode(w: Any, ids: list[int]) -> str:
    if w.tokenizer is None or not ids:
        return ""
    return w.tokenizer.decode(ids, skip_special_tokens=False)
