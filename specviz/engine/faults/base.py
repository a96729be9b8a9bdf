"""The correct engine's decisions, one hook each, and the log a fault keeps of where it deviated.

`Fault` is the correct engine: every hook returns what a correct step does. A named fault
(`layout.py`, `rows.py`, `drafting.py`, `scheduling.py`) overrides one of them. The hooks, by the
step's phase (`step.py`) that calls them:
- where positions come from (`forward_positions`; every forward: propose, verify, fill),
- how many drafts verification accepts (`accept`; verify),
- where results are written back after regrouping (`write_back`; commit),
- whether the draft catches up on its last draft token (`draft_catch_up`; fill_draft_cache),
- how the cache is rebuilt after verification (`plan`; plan_cache, for each cache),
- which positions each draft call is fed (`draft_positions`; propose),
- which token each draft call after the first is fed (`draft_inputs`; propose, draft model),
- which pending token each row feeds (`pending_tokens`; step start),
- what a step appends to its sequence's repetition-penalty history (`penalty_tokens`; commit),
- what a chunked draft prefill feeds at each chunk boundary (`draft_chunk_tokens`; prefill),
- which positions a verify forward feeds the prefill chunks it carries (`rider_positions`; mixed.py),
- whether the target's cache is tampered with before the step (`tamper_cache`; step start),
- which row's hidden state becomes each row's head carry (`head_source_rows`; after verify),
- which row's carry each row's head reads (`carry_rows`; propose, head drafting),
- what each tree node may attend in the query block (`tree_attend`; verify, tree drafting),
- which position each tree node is fed (`tree_positions`; verify, tree drafting).
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
    needs_chunks = False  # True: it corrupts chunked prefill (a run needs --prefill-chunk)
    needs_penalty = False  # True: it corrupts the repetition penalty's state (a run needs --repetition-penalty)
    outputs_exact = False  # True: outputs stay token-exact (the target verifies): only an invariant catches it

    def __init__(self) -> None:
        self.log = FaultLog(self.name)

    @classmethod
    def fires_on(cls) -> str:
        """Where the fault fires, as a run where it never did says it: "exspec", "eqspec with --proposer head"."""
        needs = [f"--proposer {cls.needs_proposer}"] if cls.needs_proposer else []
        needs += ["--tree 1 or more"] if cls.needs_tree else []
        needs += ["--repetition-penalty"] if cls.needs_penalty else []
        needs += ["--prefill-chunk"] if cls.needs_chunks else []
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

    def pending_tokens(self, pending: torch.Tensor) -> torch.Tensor:
        """[B] the token each row feeds first: its sequence's last committed token (`log.seqs`)."""
        return pending

    def draft_inputs(self, drafted: torch.Tensor, call: int, k: int) -> torch.Tensor:
        """[B, 1] the token draft call `call` >= 1 feeds: each row's own draft of call `call` - 1."""
        return drafted

    def penalty_tokens(self, row: int, emitted: list[int]) -> list[int]:
        """What row `row`'s step appends to its sequence's penalty history: every token it emitted."""
        return emitted

    def draft_chunk_tokens(
        self, fed: torch.Tensor, predicted: torch.Tensor, real: torch.Tensor, seq_ids: list[int]
    ) -> torch.Tensor:
        """[B, c] the tokens a chunked draft prefill feeds at a chunk boundary: the context's own
        (`predicted` [B]: the target's choice for the chunk's first token, -1: none; `real` [B]: the
        row has a token at that column; `seq_ids`: each row's sequence)."""
        return fed

    def rider_positions(self, positions: torch.Tensor, width: int, seq_ids: list[int]) -> torch.Tensor:
        """[R, Q] the positions a verify forward feeds the prefill chunks it carries (EXSPEC's
        riders, `mixed.py`): each rider's own, from the tokens its earlier chunks cached (`width`:
        the mixed forward's cache width, the column its first query token sits at)."""
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
