"""Faults of batch bookkeeping: which drafts count as accepted, which sequence a row's results reach."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specviz.engine.faults.base import CacheName, Fault, SlotPlan
from specviz.trace.invariants import Invariant

if TYPE_CHECKING:
    pass


class ExtraAccept(Fault):
    name = "extra-accept"
    invariants = (Invariant.ACCOUNTING, Invariant.OUTPUT)
    seen_in = "DSD baseline in eBay/spec_dec"
    summary = "accepts one draft token past the first mismatch (off by one)"

    def accept(self, matched: torch.Tensor, k: int) -> torch.Tensor:
        accepted = torch.where(matched < k, matched + 1, matched)
        self.log.rows(accepted != super().accept(matched, k), "accepted a draft the target rejected")
        return accepted


class RowMixup(Fault):
    name = "row-mixup"
    needs_rows = 2
    invariants = (Invariant.ACCOUNTING,)
    seen_in = "vLLM #14645, TensorRT-LLM #3456"
    summary = "after the batch is regrouped, results are written back to the wrong rows"
    default_method = "exspec"

    def write_back(self, regrouped: bool, batch_size: int) -> list[int]:
        if not regrouped or batch_size < 2:
            return super().write_back(regrouped, batch_size)
        perm = [(row + 1) % batch_size for row in range(batch_size)]
        for row, dest in enumerate(perm):
            self.log.row(row, f"results written to sequence {self.log.seqs[dest].seq_id}")
        return perm


class RequestOrder(Fault):
    """Results scattered back in request order; each sequence's cache then keeps as many of its
    row's new slots as the sequence was given tokens, as vLLM's scheduler advanced a request's
    computed tokens by the (leaked) tokens it received. So a row's cache never outgrows its
    sequence: the fault runs in fixed regions too (inplace, whose rows go longest prompt first)."""

    name = "request-order"
    needs_rows = 2
    invariants = (Invariant.ACCOUNTING,)
    seen_in = "vLLM V1 spec decode: tokens of other requests in large mixed batches"
    summary = "results are scattered back in request order (a dict's), not the batch's row order"
    default_method = "exspec"  # its converge policy batches by length, not in request order
    quiet_on = "or inplace; eqspec keeps the batch in request order, so results land where they belong"
    any_layout = True

    def __init__(self) -> None:
        super().__init__()
        self.given_by: list[int] = []  # per row: the row whose results its sequence received this step

    def write_back(self, regrouped: bool, batch_size: int) -> list[int]:
        seqs = self.log.seqs
        by_request = sorted(range(batch_size), key=lambda row: seqs[row].seq_id)  # arrival order
        self.given_by = [0] * batch_size
        for row, dest in enumerate(by_request):
            self.given_by[dest] = row
            if dest != row:
                self.log.row(row, f"results written to sequence {seqs[dest].seq_id}")
        return by_request

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        given = accepted[torch.tensor(self.given_by, device=accepted.device)] if self.given_by else accepted
        return super().plan(given, available, left_pad, cache)
