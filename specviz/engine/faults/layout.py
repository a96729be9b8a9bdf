"""Faults of the ragged layout: how a row's cache is rebuilt and which positions its tokens get."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specviz.engine.faults.base import POSITIONS_OFF, CacheName, Fault, FaultLog, Forward, SlotPlan
from specviz.trace.invariants import Invariant

if TYPE_CHECKING:
    from specviz.engine.kv.state import KVState


class UniformAdvance(Fault):
    name = "uniform-advance"
    needs_rows = 2
    invariants = (Invariant.POSITIONS, Invariant.KV)
    seen_in = "mlx-vlm #1144, #1155"
    summary = "every row advances its KV offset and positions by the batch's max accepted + 1"

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        return _trim_to_longest(self.log, accepted, available, cache, positions_follow_cache=True)


class ColumnPositions(Fault):
    name = "column-positions"
    needs_rows = 2
    invariants = (Invariant.POSITIONS,)
    seen_in = "unsloth #3699, nnsight #673"
    summary = "position IDs are the shared column index (cache_position), ignoring left padding"

    def forward_positions(self, next_pos: torch.Tensor, width: int, query_len: int, forward: Forward) -> torch.Tensor:
        columns = torch.arange(width, width + query_len, device=next_pos.device)
        fed = columns[None, :].expand(next_pos.shape[0], query_len)
        if forward != "fill":  # the fill's positions show in the next step's draft calls
            off = fed.ne(super().forward_positions(next_pos, width, query_len, forward)).any(1)
            self.log.rows(off, POSITIONS_OFF[forward])
        return fed


class MaskedHoles(Fault):
    name = "masked-holes"
    invariants = (Invariant.POSITIONS, Invariant.ALIGNMENT)  # 1: holes inside the attended region
    seen_in = "BSP-style masking (Su et al. 2023)"
    summary = "rejected slots stay in the cache masked out, but positions still count them"

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        every = torch.full_like(accepted, available)
        self.log.taint(accepted + 1 < available, cache)
        return SlotPlan(
            keep_new=every, attend_new=(accepted + 1).clamp(max=available), advance=every, absorb_old_pad=False
        )


class PadAccumulation(Fault):
    name = "pad-accumulation"
    needs_rows = 2
    invariants = (Invariant.ALIGNMENT, Invariant.POSITIONS, Invariant.KV)
    seen_in = "eBay/spec_dec 'compounding left-padding' fix"
    summary = "re-pads without stripping the old padding, which becomes attended row content"

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        keep = accepted + 1
        self.log.taint(left_pad > 0, cache)
        return SlotPlan(
            keep_new=keep.clamp(max=available),
            attend_new=keep.clamp(max=available),
            advance=keep + left_pad,  # the engine counts the absorbed pads as content
            absorb_old_pad=True,
        )


class StaleKV(Fault):
    name = "stale-kv"
    needs_rows = 2
    invariants = (Invariant.KV,)
    seen_in = "mlx-lm #1109, #1423"
    summary = "the cache is trimmed once for the batch, so rejected drafts' KV stays attendable"

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        return _trim_to_longest(self.log, accepted, available, cache, positions_follow_cache=False)


class MissingBonusKV(Fault):
    name = "missing-bonus-kv"
    invariants = (Invariant.KV,)
    seen_in = "vLLM #3951"
    summary = "after an all-accepted step the draft never computes KV for its last token"
    outputs_exact = True

    def draft_catch_up(self) -> bool:
        return False

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        if cache == "draft":  # a row that kept every draft lacks the last one's KV
            self.log.taint(accepted + 1 > available, cache)
        return super().plan(accepted, available, left_pad, cache)


class KVRowCopy(Fault):
    name = "kv-row-copy"
    needs_rows = 2
    invariants = (Invariant.KV,)
    seen_in = "batch-index mix-ups in cache gathers (vLLM #14645-style, on the KV instead of the tokens)"
    summary = "once, row 0's cached slots are overwritten with row 1's (same slots); masks and counts unchanged"

    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def tamper_cache(self, state: KVState) -> None:
        from specviz.engine.kv.state import cache_layers

        if self.fired or state.cache is None or state.batch_size < 2:
            return
        shared = (state.mask[0] > 0) & (state.mask[1] > 0)  # slots both rows attend: counts stay the same
        if not bool(shared.any()):
            return
        for layer in cache_layers(state.cache):
            layer.keys[0, :, shared] = layer.keys[1, :, shared]
            layer.values[0, :, shared] = layer.values[1, :, shared]
        self.fired = True
        self.log.row(0, "KV slots overwritten from row 1")


def _trim_to_longest(
    log: FaultLog, accepted: torch.Tensor, available: int, cache: CacheName, positions_follow_cache: bool
) -> SlotPlan:
    """One trim for the whole batch: every row keeps the longest row's accepted + 1 new slots.

    Rows that accepted less keep (and attend) their rejected drafts' KV. With
    `positions_follow_cache` their positions advance by the same amount (uniform advance);
    otherwise positions stay per-row correct and only the cache is wrong (stale KV).
    """
    longest = int(accepted.max()) + 1
    keep = torch.full_like(accepted, longest)
    log.taint(accepted + 1 < longest, cache)
    return SlotPlan(
        keep_new=keep.clamp(max=available),
        attend_new=keep.clamp(max=available),
        advance=keep if positions_follow_cache else accepted + 1,
        absorb_old_pad=False,
    )
