"""The recorder: the only part of `specviz.trace` the engine calls.

The engine hands over one `StepObservation` per verify step (tensors as they were fed); the
recorder turns it into plain Python records. `NullRecorder` skips all of it, so tracing overhead
can be measured against a run that records nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specviz.trace.naming import now_iso
from specviz.trace.schema import (
    SCHEMA_VERSION,
    Header,
    RowRecord,
    SequenceRecord,
    StepRecord,
    Trace,
)
from specviz.trace.token_text import step_token_ids


@dataclass
class StepObservation:
    step: int
    batch_id: int
    seq_ids: list[int]
    write_seqs: list[int]
    committed_before: list[int]
    pending: torch.Tensor  # [B]
    drafts: torch.Tensor  # [B, k]
    target_tokens: torch.Tensor  # [B, q]
    accepted: torch.Tensor  # [B]
    bonus: list[int | None]
    emitted: list[list[int]]
    positions: torch.Tensor  # [B, q] position IDs fed to the verify pass
    fed_mask: torch.Tensor  # [B, cache_len + q] attention mask fed to the verify pass
    cache_len: int
    draft_kv_len: torch.Tensor | None  # [B] attended draft slots at the first draft pass
    left_pad_after: list[int | None]
    finish_reasons: list[str | None]
    grouped: bool | None
    draft_ms: float
    verify_ms: float
    align_ms: float
    total_ms: float
    draft_positions: torch.Tensor | None = None  # [B, k] position fed at each draft call; None: no draft
    draft_call_kv_lens: torch.Tensor | None = None  # [B, k] attended draft slots before each draft call
    draft_input_tokens: torch.Tensor | None = None  # [B, k] the token each draft call fed
    penalty_history_lens: list[int] | None = None  # per row: its penalty history's length before the step
    penalty_added: list[list[int]] | None = None  # per row: what the step appended to that history
    prefill_chunks: list[list[list[int]] | None] | None = None  # per row: its chunked prefill's spans, if any
    draft_prefill_tokens: list[list[int] | None] | None = None  # per row: what that prefill fed the draft
    kv_mismatch: list[int | None] | None = None  # per row: first bad target slot; None: not checked
    query_causal: torch.Tensor | None = None  # [B] bool, when the verify block was fed as a 4-D mask
    tree_parents: list[list[int]] | None = None  # tree verification, per row: parent of each query node (-1: root)
    node_attends: torch.Tensor | None = None  # [B, N, N] bool: query nodes each node attended
    tree_paths: list[list[int]] | None = None  # per row: accepted nodes, root excluded
    kept_nodes: list[list[int]] | None = None  # per row: query nodes whose KV the commit kept
    head_sources: list[list[int]] | None = None  # per row: [seq_id, logical index] fed to the head; []: none


def mask_rle(mask: torch.Tensor) -> list[list[list[int]]]:
    """Run-length code each mask row: [[value, count], ...]. Vectorised change detection."""
    mask = mask.to(torch.int8).cpu()
    batch, width = mask.shape
    if width == 0:
        return [[] for _ in range(batch)]
    change_rows, change_cols = (mask[:, 1:] != mask[:, :-1]).nonzero(as_tuple=True)
    starts: list[list[int]] = [[0] for _ in range(batch)]
    for r, c in zip(change_rows.tolist(), change_cols.tolist()):
        starts[r].append(c + 1)
    firsts = mask[:, 0].tolist()
    out = []
    for r in range(batch):
        bounds = starts[r] + [width]
        value = firsts[r]
        runs = []
        for a, b in zip(bounds, bounds[1:]):
            runs.append([value, b - a])
            value = 1 - value
        out.append(runs)
    return out


class Recorder:
    """Turns observations into step records, kept in memory or, with a `sink`, handed to it as
    they are made (a Parquet writer: the run is never whole in memory)."""

    def __init__(self, header: Header | None, sink: StepSink | None = None) -> None:
        self.header = header
        self.steps: list[StepRecord] = []
        self.sink = sink
        self.step_token_ids: set[int] | None = set() if sink is not None else None

    def record_step(self, obs: StepObservation) -> None:
        pending = obs.pending.tolist()
        drafts = obs.drafts.tolist()
        targets = obs.target_tokens.tolist()
        accepted = obs.accepted.tolist()
        positions = obs.positions.tolist()
        masks = mask_rle(obs.fed_mask)
        kv_len = obs.fed_mask[:, : obs.cache_len].sum(1).tolist()
        draft_kv = obs.draft_kv_len.tolist() if obs.draft_kv_len is not None else None
        draft_pos = obs.draft_positions.tolist() if obs.draft_positions is not None else None
        call_kv = obs.draft_call_kv_lens.tolist() if obs.draft_call_kv_lens is not None else None
        draft_inputs = obs.draft_input_tokens.tolist() if obs.draft_input_tokens is not None else None
        checked = obs.kv_mismatch is not None
        causal = obs.query_causal.tolist() if obs.query_causal is not None else None
        tree = _tree_fields(obs)
        rows = []
        for r, seq_id in enumerate(obs.seq_ids):
            n = obs.committed_before[r]
            rows.append(
                RowRecord(
                    row=r,
                    seq_id=seq_id,
                    committed_before=n,
                    left_pad=min(_leading_run_of_zeros(masks[r]), obs.cache_len),
                    left_pad_after=obs.left_pad_after[r],
                    pending_token=pending[r],
                    draft_tokens=drafts[r],
                    target_tokens=targets[r],
                    accepted=accepted[r],
                    bonus=obs.bonus[r],
                    emitted=obs.emitted[r],
                    write_seq=obs.write_seqs[r],
                    position_ids=positions[r],
                    mask_rle=masks[r],
                    kv_len=kv_len[r],
                    kv_len_expected=n - 1,
                    draft_kv_len=draft_kv[r] if draft_kv is not None else None,
                    draft_kv_len_expected=n - 1 if draft_kv is not None else None,
                    finished=obs.finish_reasons[r] is not None,
                    finish_reason=obs.finish_reasons[r],
                    draft_position_ids=draft_pos[r] if draft_pos is not None else None,
                    draft_kv_lens=call_kv[r] if call_kv is not None else None,
                    draft_input_tokens=draft_inputs[r] if draft_inputs is not None else None,
                    penalty_history_len=obs.penalty_history_lens[r] if obs.penalty_history_lens is not None else None,
                    penalty_added=obs.penalty_added[r] if obs.penalty_added is not None else None,
                    prefill_chunks=obs.prefill_chunks[r] if obs.prefill_chunks is not None else None,
                    draft_prefill_tokens=obs.draft_prefill_tokens[r] if obs.draft_prefill_tokens is not None else None,
                    kv_content_checked=checked,
                    kv_mismatch_slot=obs.kv_mismatch[r] if checked else None,
                    query_causal=causal[r] if causal is not None else None,
                    head_source=obs.head_sources[r] if obs.head_sources is not None else None,
                    **tree[r],
                )
            )
        self._keep(
            StepRecord(
                step=obs.step,
                batch_id=obs.batch_id,
                cache_len=obs.cache_len,
                query_len=obs.positions.shape[1],
                grouped=obs.grouped,
                draft_ms=round(obs.draft_ms, 4),
                verify_ms=round(obs.verify_ms, 4),
                align_ms=round(obs.align_ms, 4),
                total_ms=round(obs.total_ms, 4),
                rows=rows,
            )
        )

    def _keep(self, step: StepRecord) -> None:
        if self.sink is None:
            self.steps.append(step)
            return
        self.step_token_ids.update(step_token_ids(step.rows))  # type: ignore[union-attr]
        self.sink.add_step(step)

    def finish(self, sequences: list[SequenceRecord], complete: bool, decode_seconds: float) -> Trace:
        self.header.complete = complete
        self.header.finished_at = now_iso()
        self.header.decode_seconds = round(decode_seconds, 6)
        return Trace(header=self.header, steps=self.steps, sequences=sequences)


class StepSink(Protocol):
    """Where a recorder with a sink sends each step as it is made (`ParquetTraceWriter`)."""

    def add_step(self, step: StepRecord) -> None: ...


class NullRecorder(Recorder):
    """Records no steps: the tracing-off arm of the overhead measurement."""

    def record_step(self, obs: StepObservation) -> None:
        return None


def _tree_fields(obs: StepObservation) -> list[dict[str, Any]]:
    """Per row, the tree fields of a tree step (none of a chain step)."""
    rows = len(obs.seq_ids)
    if obs.tree_parents is None:
        return [{} for _ in range(rows)]
    depths = []
    for parents in obs.tree_parents:
        row_depths: list[int] = []
        for parent in parents:
            row_depths.append(0 if parent < 0 else row_depths[parent] + 1)  # parents precede children
        depths.append(row_depths)
    attends = None
    if obs.node_attends is not None:
        attends = [[row.nonzero().flatten().tolist() for row in nodes] for nodes in obs.node_attends.cpu()]
    return [
        {
            "tree_parents": list(obs.tree_parents[r]),
            "tree_depths": depths[r],
            "node_attends": attends[r] if attends is not None else None,
            "tree_path": obs.tree_paths[r] if obs.tree_paths is not None else None,
            "kept_nodes": obs.kept_nodes[r] if obs.kept_nodes is not None else None,
        }
        for r in range(rows)
    ]


def _leading_run_of_zeros(runs: list[list[int]]) -> int:
    """Left padding, read off the run-length-coded mask row already built for the trace."""
    return runs[0][1] if runs and runs[0][0] == 0 else 0


def new_header(**fields: Any) -> Header:
    return Header(schema_version=SCHEMA_VERSION, created_at=now_iso(), **fields)
