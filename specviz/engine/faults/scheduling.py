"""Faults of state carried from one step, or one draft call, to the next (2025-26 serving bugs).

Each reproduces one bug thread of docs/faults.md's scheduling table: a pending token not yet
written back, positions built for the next step before acceptance was known, a per-row offset
array left uncompacted around a padded row, a token-to-row map reused past the call it was built
for. They fire on greedy and sampled runs alike (none reads a token's probability).
"""

from __future__ import annotations

import torch

from specviz.engine.faults.base import POSITIONS_OFF, CacheName, Fault, Forward, SlotPlan
from specviz.trace.invariants import Invariant


class StalePending(Fault):
    """Once (the first step a sequence comes back), the batch's last row feeds the token its
    sequence fed the step before (the previous bonus), as a request rescheduled before its
    accepted tokens were written back did. Its KV then sits where the real pending token's goes."""

    name = "stale-pending"
    invariants = (Invariant.ACCOUNTING,)
    seen_in = "vLLM #52071: a request rescheduled before its accepted tokens were written back"
    summary = "once, the last row feeds the token it fed the step before (the previous bonus), not its pending token"
    any_layout = True

    def __init__(self) -> None:
        super().__init__()
        self.fed: dict[int, int] = {}  # seq_id -> the pending token it fed last step
        self.fired = False

    def pending_tokens(self, pending: torch.Tensor) -> torch.Tensor:
        seqs, row = self.log.seqs, pending.shape[0] - 1
        stale = self.fed.get(seqs[row].seq_id)
        self.fed = {seq.seq_id: seq.pending for seq in seqs}
        if self.fired or stale is None or stale == seqs[row].pending:
            return pending
        self.fired = True
        self.log.row(row, "fed the previous step's pending token")
        fed = pending.clone()
        fed[row] = stale
        return fed


class AsyncAhead(Fault):
    """Positions and cache lengths of step t+1 built as if every draft of step t was accepted
    (async scheduling plans the next step before verification ends); only the tokens were
    corrected. A row that accepted a < k drafts keeps its rejected drafts' KV and runs k - a ahead."""

    name = "async-ahead"
    invariants = (Invariant.POSITIONS, Invariant.KV)
    seen_in = "vLLM-Ascend #10032 (async speculation): next-step positions and slots assume all drafts accepted"
    summary = "every row's next positions and KV length advance by k + 1, as if all drafts were accepted"

    def __init__(self) -> None:
        super().__init__()
        self.k = 0

    def accept(self, matched: torch.Tensor, k: int) -> torch.Tensor:
        self.k = k  # the plan advances by the drafts proposed, which only verification names
        return super().accept(matched, k)

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        every = torch.full_like(accepted, available)
        self.log.taint(accepted < self.k, cache)
        return SlotPlan(
            keep_new=every, attend_new=every, advance=torch.full_like(accepted, self.k + 1), absorb_old_pad=False
        )


class MidBatchPad(Fault):
    """A dummy row padded into the middle of the batch (at B // 2) while the per-row offset array
    was not compacted around it: every row from the middle on reads its neighbour's position
    offset (row r gets row r - 1's), at the verify forward. Rows of equal length hide it."""

    name = "mid-batch-pad"
    needs_rows = 2
    invariants = (Invariant.POSITIONS,)
    seen_in = "TensorRT-LLM PR #6136, #3839: a padded dummy row mid-batch; per-row offsets not compacted"
    summary = "rows from the middle of the batch on are fed their neighbour's position offset at the verify"

    def forward_positions(self, next_pos: torch.Tensor, width: int, query_len: int, forward: Forward) -> torch.Tensor:
        rows = next_pos.shape[0]
        if forward != "verify" or rows < 2:
            return super().forward_positions(next_pos, width, query_len, forward)
        middle = rows // 2
        shifted = torch.cat([next_pos[:middle], next_pos[middle - 1 : rows - 1]])  # [B] the stale array
        self.log.rows(shifted != next_pos, POSITIONS_OFF["verify"])
        return super().forward_positions(shifted, width, query_len, forward)


class StaleDraftMap(Fault):
    """The token-to-row map built for the verify forward (k + 1 tokens a row) reused for draft
    calls 1..k-1 (one token a row): row r reads row r // (k + 1)'s token. Call 0 builds its own
    map, and at batch 1 every index maps to row 0: exact there; at batch > 1 rows 1..k read row
    0's drafts. The target verifies, so outputs stay exact; acceptance falls with depth."""

    name = "stale-draft-map"
    needs_rows = 2
    invariants = (Invariant.DRAFT_INPUT,)
    seen_in = "TensorRT-LLM PR #17240: a token-to-request map built once per verify, reused for draft steps"
    summary = "draft calls after the first feed each row the token of row r // (k + 1), via the verify's index map"
    needs_proposer = "draft-model"
    outputs_exact = True

    def draft_inputs(self, drafted: torch.Tensor, call: int, k: int) -> torch.Tensor:
        rows = drafted.shape[0]
        if rows < 2:
            return drafted
        stale = torch.arange(rows, device=drafted.device) // (k + 1)  # [B] the verify's token -> row map
        fed = drafted[stale]
        self.log.rows(fed[:, 0] != drafted[:, 0], "draft fed another row's token")
        return fed


class PenaltyHistory(Fault):
    """The repetition penalty's token history appended with one token per step (the last emitted)
    instead of every token the step emitted: from the first step that accepts a draft, the
    penalty misses the accepted drafts, so outputs differ from batch-1 only with a penalty on.
    No tensor of the step desyncs: only the sampling-state check sees it."""

    name = "penalty-history"
    invariants = (Invariant.SAMPLING_STATE,)
    seen_in = "SGLang PR #33643, vLLM #30122: penalties and min_new_tokens counted one token per step"
    summary = "the repetition penalty's history gets one token per step, not the step's accepted drafts and bonus"
    any_layout = True
    needs_penalty = True

    def penalty_tokens(self, row: int, emitted: list[int]) -> list[int]:
        kept = emitted[-1:]
        if len(kept) != len(emitted):
            self.log.row(row, f"penalty history given {len(kept)} of {len(emitted)} emitted tokens")
        return kept


class ChunkBoundaryFeed(Fault):
    """At each chunk boundary of a chunked prefill, the draft is fed the target's predicted token
    for that position (its choice after the previous chunk) instead of the context's own next
    token, where the two differ. The target's cache is right, so outputs stay exact; the draft's
    KV is wrong from the boundary on and acceptance drops."""

    name = "chunk-boundary-feed"
    invariants = (Invariant.DRAFT_INPUT,)
    seen_in = "SGLang PRs #26329, #26800, #28254: draft fed the target's predicted token at a chunk boundary"
    summary = (
        "a chunked prefill feeds the draft the target's prediction, not the prompt's token, at each chunk boundary"
    )
    needs_proposer = "draft-model"
    needs_chunks = True
    any_layout = True  # every layout prefills its draft in chunks (inplace: its fixed regions)
    outputs_exact = True

    def draft_chunk_tokens(
        self, fed: torch.Tensor, predicted: torch.Tensor, real: torch.Tensor, seq_ids: list[int]
    ) -> torch.Tensor:
        swap = real.bool() & (predicted >= 0) & (predicted != fed[:, 0])  # [B]
        if not bool(swap.any()):
            return fed
        for row in swap.nonzero().flatten().tolist():  # seen at the sequence's next step, where it is recorded
            self.log.taint_seq(seq_ids[row], "draft fed the target's prediction at a chunk boundary")
        out = fed.clone()
        out[:, 0] = torch.where(swap, predicted, fed[:, 0])
        return out


class RiderPosition(Fault):
    """A prefill chunk carried by a verify forward (EXSPEC with `--prefill-chunk`) is fed positions
    from its column in the mixed batch, `width + i`, as the batch's verify rows count theirs,
    instead of from the tokens its own earlier chunks cached. The rider's keys sit at the wrong
    positions from that chunk on; the row of the sequence's first step records the chunk's
    position (`prefill_chunks`) and the KV check reads the wrong keys."""

    name = "rider-position"
    invariants = (Invariant.POSITIONS, Invariant.KV)
    seen_in = (
        "no single thread: built for the mixed forward, where a prefill chunk's positions must come from "
        "its own cached tokens, not the batch (SGLang PR #2158 fixed other metadata of mixed chunked prefill)"
    )
    summary = "a chunk riding in a verify forward is fed positions from its column in the mixed batch, not its own"
    default_method = "exspec"
    quiet_on = "only where a waiting prompt's chunk rides with rows wider than its cache"
    needs_chunks = True

    def rider_positions(self, positions: torch.Tensor, width: int, seq_ids: list[int]) -> torch.Tensor:
        own_first = positions[:, :1]  # [R, 1] what the rider's earlier chunks cached
        off = positions - own_first + width  # [R, Q] the column count of the mixed batch
        for row in (off[:, 0] != own_first[:, 0]).nonzero().flatten().tolist():  # seen at its first step
            self.log.taint_seq(seq_ids[row], "a carried prefill chunk fed positions from the mixed batch's width")
        return off
