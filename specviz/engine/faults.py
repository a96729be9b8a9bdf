"""Named faults: each reproduces one bug that real batch speculative decoding engines shipped.

A fault is a small override of one decision the correct engine makes (docs/faults.md), each
inside one phase of the step (`step.py`):
- where positions come from (`forward_positions`; every forward: propose, verify, fill),
- how many drafts verification accepts (`accept`; verify),
- where results are written back after regrouping (`write_back`; commit),
- whether the draft catches up on its last draft token (`draft_catch_up`; fill_draft_cache),
- how the cache is rebuilt after verification (`plan`; plan_cache, for each cache),
- which positions each draft call is fed (`draft_positions`; propose),
- whether the target's cache is tampered with before the step (`tamper_cache`; step start),
- which row's hidden state becomes each row's head carry (`head_source_rows`; after verify),
- which row's carry each row's head reads (`carry_rows`; propose, head drafting),
- what each tree node may attend in the query block (`tree_attend`; verify, tree drafting),
- which position each tree node is fed (`tree_positions`; verify, tree drafting).
The base class is the correct engine, so the fixed and faulty paths share all other code.
Faults are deterministic: same inputs, same corruption.

Each fault records its own deviations in its `FaultLog`: an override computes the correct value
(the base hook), compares it with its own and logs the rows that differ. The correct engine's
hooks compare nothing, so a run without a fault pays no comparison and no host sync for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from specviz.engine.batch import SeqState
from specviz.trace.invariants import Invariant

if TYPE_CHECKING:
    from specviz.engine.kv.state import KVState

Forward = Literal["draft", "verify", "fill"]  # which forward of a step positions are fed to
POSITIONS_OFF: dict[str, str] = {
    "draft": "draft fed positions off its count",
    "verify": "position IDs differ from the row's real-token count",
}
CacheName = Literal["target", "draft"]

# What a row's next step reports when a cache plan left it unlike a correct engine's.
TAINTS: dict[str, str] = {"target": "target cache or positions rebuilt wrongly", "draft": "draft cache missing KV"}


@dataclass
class FaultLog:
    """The deviations a fault recorded: one event per (step, row, what), at most once per step.

    `begin` names the step and its rows' sequences. A cache a fault altered is reported at the
    step that next feeds the sequence (`taint`, then `begin`), where the damage shows.
    """

    fault: str
    events: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0
    seqs: list[SeqState] = field(default_factory=list)
    logged: set[tuple[int, str]] = field(default_factory=set)  # (row, what) this step
    taints: dict[int, str] = field(default_factory=dict)  # seq_id -> what, reported at its next step

    def begin(self, step: int, seqs: list[SeqState]) -> None:
        self.step, self.seqs, self.logged = step, seqs, set()
        for row, seq in enumerate(seqs):
            if seq.seq_id in self.taints:
                self.row(row, self.taints.pop(seq.seq_id))

    def row(self, row: int, what: str) -> None:
        if (row, what) in self.logged:
            return
        self.logged.add((row, what))
        self.events.append(
            {"step": self.step, "row": row, "seq_id": self.seqs[row].seq_id, "fault": self.fault, "what": what}
        )

    def taint_seq(self, seq_id: int, what: str) -> None:
        """Sequence `seq_id` was handed a wrong state (a head carry): reported at its next step."""
        self.taints.setdefault(seq_id, what)

    def rows(self, deviating: torch.Tensor, what: str) -> None:
        """Log every row where `deviating` [B] bool is set (one host read)."""
        for row in deviating.nonzero().flatten().tolist():
            self.row(row, what)

    def taint(self, altered: torch.Tensor, cache: CacheName) -> None:
        """Rows `altered` [B] bool whose `cache` a plan rebuilt wrongly: reported at their next step."""
        for row in altered.nonzero().flatten().tolist():
            seq = self.seqs[row]
            if not seq.done and seq.seq_id not in self.taints:
                self.taints[seq.seq_id] = TAINTS[cache]


@dataclass
class SlotPlan:
    """How each row's cache is rebuilt from [old slots | new query slots] after verification."""

    keep_new: torch.Tensor  # [B] new slots retained (correct: accepted + 1)
    attend_new: torch.Tensor  # [B] of those, marked attended (correct: all retained)
    advance: torch.Tensor  # [B] next_pos increment (correct: accepted + 1)
    absorb_old_pad: bool  # old leading padding becomes attended content (correct: False)


class Fault:
    """The correct engine. Subclasses override one decision each."""

    name = "none"
    invariants: tuple[Invariant, ...] = ()
    seen_in = ""
    summary = "no fault: the correct engine"
    # The method `record --fault NAME` runs when no --method is given: one where the fault's decision
    # is reached (docs/faults.md names the same; tests/engine/test_fault_methods.py compares them).
    default_method = "eqspec"
    quiet_on = ""  # where its decision is never reached, and why (a run there says "never fired")
    needs_rows = 1  # 2: its decision differs only between rows (docs/faults.md: "only ... two rows?")
    any_layout = False  # True: the fault's decision exists in every layout (inplace accepts it)
    needs_proposer: str | None = None  # the proposer whose decision it overrides ("head"), if any
    needs_tree = False  # True: it overrides a tree decision (a run needs --tree)

    def __init__(self) -> None:
        self.log = FaultLog(self.name)

    @classmethod
    def fires_on(cls) -> str:
        """Where the fault fires, as a run where it never did says it: "exspec", "eqspec with --proposer head"."""
        needs = ([f"--proposer {cls.needs_proposer}"] if cls.needs_proposer else []) + (
            ["--tree 1 or more"] if cls.needs_tree else []
        )
        return (
            cls.default_method
            + (f" with {' and '.join(needs)}" if needs else "")
            + (", in a batch of two rows or more" if cls.needs_rows > 1 else "")
            + (f" ({cls.quiet_on})" if cls.quiet_on else "")
        )

    def forward_positions(self, next_pos: torch.Tensor, width: int, query_len: int, forward: Forward) -> torch.Tensor:
        """Position IDs [B, query_len] for a forward after a cache of `width` slots (every forward)."""
        offsets = torch.arange(query_len, device=next_pos.device)
        return next_pos[:, None] + offsets[None, :]

    def accept(self, matched: torch.Tensor, k: int) -> torch.Tensor:
        """`matched`: longest agreeing prefix per row. Greedy verification accepts exactly it."""
        return matched

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        """Keep the pending token and the accepted drafts; drop every rejected slot."""
        keep = accepted + 1
        return SlotPlan(
            keep_new=keep.clamp(max=available), attend_new=keep.clamp(max=available), advance=keep, absorb_old_pad=False
        )

    def draft_catch_up(self) -> bool:
        """After an all-accepted step the draft lacks KV for its last draft: compute it."""
        return True

    def write_back(self, regrouped: bool, batch_size: int) -> list[int]:
        """Row r's results go to the sequence of row perm[r]."""
        return list(range(batch_size))

    def draft_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Position IDs for one draft call, as the engine computed them."""
        return positions

    def tamper_cache(self, state: KVState) -> None:
        """Leave the target's cache alone (before the step)."""

    def head_source_rows(self, batch_size: int) -> list[int]:
        """Row r's next head carry is taken from row sources[r]'s hidden states: its own."""
        return list(range(batch_size))

    def carry_rows(self, batch_size: int) -> list[int]:
        """Row r's head reads the carry of the sequence in row readers[r]: its own."""
        return list(range(batch_size))

    def tree_attend(self, ancestors: torch.Tensor) -> torch.Tensor:
        """[N, N] (or [B, N, N], a tree per row) bool: what each node of the query block attends:
        itself and its ancestors."""
        return ancestors

    def tree_positions(self, next_pos: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """[B, N] position of each tree node: the row's next position plus the node's depth
        (`depths` [N], or [B, N] for a tree per row)."""
        return next_pos[:, None] + (depths if depths.dim() == 2 else depths[None, :])


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


class MissingBonusKV(Fault):
    name = "missing-bonus-kv"
    invariants = (Invariant.KV,)
    seen_in = "vLLM #3951"
    summary = "after an all-accepted step the draft never computes KV for its last token"

    def draft_catch_up(self) -> bool:
        return False

    def plan(self, accepted: torch.Tensor, available: int, left_pad: torch.Tensor, cache: CacheName) -> SlotPlan:
        if cache == "draft":  # a row that kept every draft lacks the last one's KV
            self.log.taint(accepted + 1 > available, cache)
        return super().plan(accepted, available, left_pad, cache)


class DraftPositions(Fault):
    name = "draft-positions"
    invariants = (Invariant.POSITIONS,)
    seen_in = "draft fed the wrong position offset (EAGLE/Medusa-style off-by-one)"
    summary = "the draft is fed position IDs one past the right ones; the target verifies, so outputs stay exact"

    def draft_positions(self, positions: torch.Tensor) -> torch.Tensor:
        fed = positions + 1
        self.log.rows(fed.ne(super().draft_positions(positions)).any(1), POSITIONS_OFF["draft"])
        return fed


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


class HeadSourceIndex(Fault):
    name = "head-source-index"
    needs_rows = 2
    invariants = (Invariant.HEAD,)
    seen_in = "vllm-ascend EAGLE-3 proposer: wrong source indices under concurrency"
    summary = "each row's head carry is gathered from the next row's hidden states (an index off by one row)"
    default_method = "exspec"
    any_layout = True
    needs_proposer = "head"

    def head_source_rows(self, batch_size: int) -> list[int]:
        return [(row + 1) % batch_size for row in range(batch_size)]


class SharedCarry(Fault):
    name = "shared-carry"
    needs_rows = 2
    invariants = (Invariant.HEAD,)
    seen_in = "llama.cpp-fork MTP drafting: sequence 0 hard-coded, carry-over state shared across slots"
    summary = "every row's head reads row 0's carry-over hidden state"
    default_method = "eqspec"
    any_layout = True
    needs_proposer = "head"

    def carry_rows(self, batch_size: int) -> list[int]:
        return [0] * batch_size


class TreeSiblingMask(Fault):
    name = "tree-sibling-mask"
    invariants = (Invariant.KV,)
    seen_in = "tree attention masks built causally over the flattened tree (siblings visible)"
    summary = "the tree mask lets each node see its siblings listed before it, not only its ancestors"
    default_method = "eqspec"
    any_layout = True
    needs_tree = True

    def tree_attend(self, ancestors: torch.Tensor) -> torch.Tensor:
        size = ancestors.shape[-1]
        # A node sees the flattened block causally: every node listed before it, siblings included.
        causal = torch.ones(size, size, dtype=torch.bool, device=ancestors.device).tril()
        fed = ancestors | causal
        if bool((fed != ancestors).any()):
            for row in range(len(self.log.seqs)):
                self.log.row(row, "tree node attends nodes that are not its ancestors")
        return fed


class TreeNodePositions(Fault):
    name = "tree-node-positions"
    invariants = (Invariant.POSITIONS,)
    seen_in = "tree verification fed positions by node index instead of depth"
    summary = "each tree node's position is the row's next position plus its node index, not its depth"
    default_method = "eqspec"
    any_layout = True
    needs_tree = True

    def tree_positions(self, next_pos: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        index = torch.arange(depths.shape[-1], device=next_pos.device)
        if bool((index != depths).any()):
            for row in range(next_pos.shape[0]):
                self.log.row(row, POSITIONS_OFF["verify"])
        return next_pos[:, None] + index[None, :]


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


FAULTS: dict[str, type[Fault]] = {
    cls.name: cls
    for cls in (
        UniformAdvance,
        ColumnPositions,
        MaskedHoles,
        PadAccumulation,
        StaleKV,
        ExtraAccept,
        RowMixup,
        MissingBonusKV,
        DraftPositions,
        KVRowCopy,
        RequestOrder,
        HeadSourceIndex,
        SharedCarry,
        TreeSiblingMask,
        TreeNodePositions,
    )
}


def make_fault(name: str | None) -> Fault:
    if name is None or name == "none":
        return Fault()
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; choose from {', '.join(FAULTS)}")
    return FAULTS[name]()
