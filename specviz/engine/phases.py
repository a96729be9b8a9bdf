"""The typed results of a step's beats (`step.py`): what verification decided, what was committed,
and what the step hands its method to rebuild the caches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.engine.batch import Batch
from specviz.engine.keep import row_parents
from specviz.engine.kv.state import CachePlan
from specviz.engine.proposers.base import Proposals
from specviz.trace.recorder import StepObservation


@dataclass(frozen=True)
class Verification:
    """What the target's forward over [pending, drafts] decided."""

    positions: torch.Tensor  # [B, k + 1] position IDs fed
    fed_mask: torch.Tensor  # [B, cache_len + k + 1] attention mask fed
    cache_len: int  # target cache slots before this forward
    target_tokens: torch.Tensor  # [B, k + 1] the target's choice after each fed slot
    matched: torch.Tensor  # [B] leading drafts that agree with the target
    accepted: torch.Tensor  # [B] drafts kept (a correct engine keeps exactly `matched`)
    seconds: float
    paths: list[list[int]] | None = None  # tree: per row the accepted nodes, root excluded
    node_attends: torch.Tensor | None = None  # tree: [B, N, N] query-block nodes each node attended
    hidden: torch.Tensor | None = None  # [B, q, H] the target's last hidden states (head drafting)

    def last_node(self, row: int) -> int:
        """The query slot of the row's last accepted node (its bonus is the target's choice there)."""
        if self.paths is None:
            return int(self.accepted[row])
        path = self.paths[row]
        return path[-1] if path else 0


@dataclass(frozen=True)
class Commit:
    """What was written to the sequences."""

    emitted: list[list[int]]  # per row: tokens appended (accepted drafts + bonus, cut at EOS/budget)
    bonus: list[int | None]  # per row: the target's own token, None where the cut dropped it
    write_seqs: list[int]  # per row: the sequence its tokens went to (its own, unless a fault)
    finish_reasons: list[str | None]  # per row: its own sequence's, after the commit
    active: torch.Tensor  # [B] bool: rows whose own sequence continues

    @property
    def active_rows(self) -> torch.Tensor:
        return self.active.nonzero().flatten()


@dataclass
class StepOutcome:
    """What a step produced, plus the plans the caller applies to rebuild the caches."""

    observation: StepObservation
    active_rows: torch.Tensor  # rows whose own sequence continues
    target_plan: CachePlan
    draft_plan: CachePlan | None  # None: no draft cache (the baseline)
    started: float  # clock at the step's start: `finish_step` closes the total from it
    stepped: float  # clock when the step returned: `finish_step` closes the alignment from it


def observe(
    step_index: int,
    batch: Batch,
    committed: list[int],
    pending: torch.Tensor,
    proposals: Proposals,
    verification: Verification,
    commit: Commit,
    fill_s: float,
    kv_mismatch: list[int | None] | None,
) -> StepObservation:
    """The step as the recorder takes it: what was fed and decided, row by row (tensors as fed)."""
    return StepObservation(
        step=step_index,
        batch_id=batch.batch_id,
        seq_ids=[s.seq_id for s in batch.seqs],
        write_seqs=commit.write_seqs,
        committed_before=committed,
        pending=pending,
        drafts=proposals.node_tokens,
        target_tokens=verification.target_tokens,
        accepted=verification.accepted,
        bonus=commit.bonus,
        emitted=commit.emitted,
        positions=verification.positions,
        fed_mask=verification.fed_mask,
        cache_len=verification.cache_len,
        draft_kv_len=proposals.kv_len,
        left_pad_after=[None] * len(batch.seqs),
        finish_reasons=commit.finish_reasons,
        grouped=batch.grouped,
        draft_ms=(proposals.seconds + fill_s) * 1000,
        verify_ms=verification.seconds * 1000,
        align_ms=0.0,  # closed by finish_step, after the caller applied the plans
        total_ms=0.0,
        draft_positions=proposals.positions if proposals.kv_len is not None else None,
        draft_call_kv_lens=proposals.call_kv_lens,
        draft_input_tokens=proposals.input_tokens,
        kv_mismatch=kv_mismatch,
        query_causal=None if proposals.tree is not None else getattr(batch.target, "query_causal", None),
        tree_parents=row_parents(proposals.tree, len(batch.seqs)),
        node_attends=verification.node_attends,
        tree_paths=verification.paths,
        head_sources=proposals.head_sources,
    )
