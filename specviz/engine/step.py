"""One verify step of batch speculative decoding, shared by every method.

A step reads as four beats, in the order gpt-fast's `speculative_decode` reads, each a method
with a small typed result:

1. `propose` -> `Proposals`: the draft proposes k tokens per row, one forward of one token each
   on its own cache. The baseline (plain batched greedy) has no draft: `Proposals.none`.
2. `verify` -> `Verification`: the target scores [pending, d1..dk] in one forward; the accept
   rule keeps the longest prefix of drafts that agrees with the target's own choices.
3. `commit` -> `Commit`: the accepted drafts plus one target token (the bonus) are appended to
   the sequences.
4. `plan_cache` -> `CachePlan`, once per cache: which slots each continuing row keeps and where
   its positions resume. Before the draft's plan, `fill_draft_cache` computes the KV the draft
   lacks after an all-accepted step. The baseline has no draft cache, so no draft plan.

The method applies the plans (EQSPEC realigns the batch, EXSPEC stores it back into the pool,
INPLACE grows each row's length) and calls `finish_step`, which closes the step's timings and
hands it to the recorder. Tokens are chosen by one set of rules, `EngineConfig.rules` (`rules.py`:
greedy by default, or coupled or rejection sampling keyed by (seed, seq_id, logical index)), used
by both the draft and the target, so verification compares like with like. Fault hooks
(`faults.py`) each override one decision inside one beat and log their own deviations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specviz.engine.batch import Batch, SeqState
from specviz.engine.clock import now
from specviz.engine.faults import CacheName, Fault, SlotPlan
from specviz.engine.kv.content import KVContentChecker
from specviz.engine.kv.headroom import with_headroom
from specviz.engine.kv.state import CachePlan, KVState, feed, leading_zeros
from specviz.engine.rules import SampleKeys, TokenRules, agreeing_prefix
from specviz.trace.recorder import NullRecorder, Recorder, StepObservation

__all__ = ["agreeing_prefix"]  # re-exported: the accept rule of greedy and coupled verification


# ---------------------------------------------------------------------- phase results


@dataclass(frozen=True)
class Proposals:
    """What the draft proposed (vLLM's `SpeculativeProposals`)."""

    tokens: torch.Tensor  # [B, k] draft tokens; k = 0 without a draft
    positions: torch.Tensor  # [B, k] position ID fed at each draft call (column j: call j)
    kv_len: torch.Tensor | None  # [B] attended draft slots at the first draft call; None: no draft
    cache_width: int  # draft cache slots before the first draft call
    seconds: float
    logits: torch.Tensor | None = None  # [B, k, V] the draft's logits, kept only for rejection sampling
    call_kv_lens: torch.Tensor | None = None  # [B, k] attended draft slots before each draft call

    @property
    def k(self) -> int:
        return self.tokens.shape[1]

    @classmethod
    def none(cls, pending: torch.Tensor) -> Proposals:
        """The baseline's: no draft, nothing proposed, the target decodes one token per row."""
        empty = pending.new_zeros(pending.shape[0], 0)
        return cls(tokens=empty, positions=empty, kv_len=None, cache_width=0, seconds=0.0)


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


# ---------------------------------------------------------------------- the engine


@dataclass(frozen=True)
class EngineConfig:
    """What a run decodes with: fixed for the run."""

    target: Any
    draft: Any | None  # None: the baseline (then k = 0)
    k: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    pad_id: int
    device: torch.device
    fault: Fault = field(default_factory=Fault)
    rules: TokenRules = field(default_factory=TokenRules)
    kv_check_every: int = 0  # check the target's KV content every N steps (0: never)

    def __post_init__(self) -> None:
        if (self.draft is None) != (self.k == 0):
            raise ValueError(f"a draft model needs k >= 1 and k >= 1 needs a draft model (k={self.k})")

    @property
    def cache_headroom(self) -> int:
        """Headroom a cache keeps past its width (kv/headroom.py): a step feeds each cache at most
        k + 1 slots (the draft's catch-up token plus its proposals; the verify block)."""
        return self.k + 2


@dataclass
class RunContext:
    """What a run accumulates: the recorder, the step count, the tracing cost, the KV check."""

    recorder: Recorder = field(default_factory=lambda: NullRecorder(header=None))  # outside `run`: nothing
    on_tokens: Callable[[int], None] | None = None  # progress: tokens emitted this step
    step_index: int = 0
    # Seconds spent tracing (the recorder's `record_step` and the sampled KV-content check): the
    # cost of a traced run measured inside it, free of the run-to-run noise of comparing two runs.
    tracing_seconds: float = 0.0
    kv_checker: KVContentChecker | None = None
    kv_check_unavailable: str | None = None  # why the KV-content check was switched off mid-run


class Engine:
    """The step and its beats over one `EngineConfig`; bookkeeping goes to the `RunContext`."""

    def __init__(self, config: EngineConfig, context: RunContext | None = None) -> None:
        self.config = config
        self.context = context if context is not None else RunContext()
        self.target, self.draft, self.k, self.device = config.target, config.draft, config.k, config.device
        self.fault, self.rules = config.fault, config.rules

    @property
    def max_new_tokens(self) -> int:
        return self.config.max_new_tokens

    @property
    def cache_headroom(self) -> int:
        return self.config.cache_headroom

    @property
    def fault_events(self) -> list[dict[str, Any]]:
        return self.fault.log.events

    def now(self) -> float:
        return now(self.device)

    @torch.no_grad()
    def prefill(self, model: Any, seqs: list[SeqState], cache: Any | None = None) -> KVState:
        """Cache every committed token but the pending one, left-padded, positions from lengths.

        `cache`: an empty cache to write into (placement.py's rows of a batch); default: a new one."""
        device = self.device
        contexts = [s.prompt_ids + s.output_ids[:-1] if s.output_ids else s.prompt_ids[:-1] for s in seqs]
        width = max(len(c) for c in contexts)
        lengths = torch.tensor([len(c) for c in contexts], device=device)
        state = KVState(cache=cache, mask=torch.zeros(len(seqs), 0, dtype=torch.long, device=device), next_pos=lengths)
        if width == 0:
            return state
        ids = torch.full((len(seqs), width), self.config.pad_id, dtype=torch.long, device=device)  # [B, W]
        mask = torch.zeros(len(seqs), width, dtype=torch.long, device=device)  # [B, W]
        for row, context in enumerate(contexts):
            if context:
                ids[row, width - len(context) :] = torch.tensor(context, device=device)
                mask[row, width - len(context) :] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # [B, W]
        feed(model, state, ids, positions, query_mask=mask)
        state.cache = with_headroom(state.cache, self.cache_headroom)
        return state

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def step(self, batch: Batch) -> StepOutcome:
        started, seqs, device = self.now(), batch.seqs, self.device
        self.fault.log.begin(self.context.step_index, seqs)
        self.fault.tamper_cache(batch.target)
        kv_mismatch = self.check_kv_content(batch.target, seqs)
        pending = torch.tensor([s.pending for s in seqs], device=device)  # [B]
        committed = [s.committed for s in seqs]
        keys = SampleKeys(
            seq_ids=torch.tensor([s.seq_id for s in seqs], device=device), first=torch.tensor(committed, device=device)
        )

        # 1. Propose: k draft tokens per row (none for the baseline).
        proposals = Proposals.none(pending) if batch.draft is None else self.propose(batch.draft, pending, keys)
        # 2. Verify: one target forward over [pending, d1..dk]; keep the agreeing prefix.
        verification = self.verify(batch.target, pending, proposals, keys)
        # 3. Commit: each row's accepted drafts plus the bonus go to its sequence.
        commit = self.commit(batch, proposals.tokens, verification)
        # 4. Plan the caches. The target's holds [old | pending, d1..dk]; the draft's [old | d1..dk]
        # (+ the last draft's KV once filled). The baseline has no draft cache to fill or plan.
        target_plan = self.plan_cache(batch.target, verification.cache_len, verification.accepted, "target")
        draft_plan, fill_s = None, 0.0
        if batch.draft is not None:
            fill_s = self.fill_draft_cache(batch.draft, proposals, verification.accepted)
            draft_plan = self.plan_cache(batch.draft, proposals.cache_width, verification.accepted, "draft")

        self._committed(seqs, commit)
        observation = self._observe(batch, committed, pending, proposals, verification, commit, fill_s, kv_mismatch)
        return StepOutcome(observation, commit.active_rows, target_plan, draft_plan, started, self.now())

    def finish_step(self, outcome: StepOutcome, left_pad_after: list[int | None], align_before_s: float = 0.0) -> None:
        """Close the step's timings once the method applied its plans, and hand it to the recorder.

        Alignment runs from the step's return to now, plus `align_before_s` the method spent
        aligning before the step (EXSPEC's gather of the group), which also counts in the total."""
        end = self.now()
        obs = outcome.observation
        obs.left_pad_after = left_pad_after
        obs.align_ms = (end - outcome.stepped + align_before_s) * 1000
        obs.total_ms = (end - outcome.started + align_before_s) * 1000
        self.context.recorder.record_step(obs)
        self.context.tracing_seconds += self.now() - end
        self.context.step_index += 1

    # ------------------------------------------------------------------ the beats

    def propose(self, state: KVState, pending: torch.Tensor, keys: SampleKeys | None = None) -> Proposals:
        """k draft tokens per row, one forward each on the draft's own cache.

        `keys` name each row's sequence and next logical index, for keyed sampling (greedy ignores them).
        """
        started = self.now()
        kv_len, cache_width = state.mask.sum(1), state.width
        tokens = pending[:, None]  # [B, 1]
        drafted, fed_positions, kept_logits, call_kv_lens = [], [], [], []
        for j in range(self.k):
            positions = self.fault.forward_positions(state.next_pos + j, state.width, 1, "draft")  # [B, 1]
            positions = self.fault.draft_positions(positions)
            call_kv_lens.append(state.mask.sum(1, keepdim=True))  # the call's one query attends these
            logits = feed(self.draft, state, tokens, positions)[:, -1:]  # [B, 1, V]
            tokens = self.rules.select(logits, keys, offset=j)
            drafted.append(tokens)
            fed_positions.append(positions)
            if self.rules.keeps_draft_logits:
                kept_logits.append(logits)
        return Proposals(
            tokens=torch.cat(drafted, dim=1),
            positions=torch.cat(fed_positions, dim=1),
            kv_len=kv_len,
            cache_width=cache_width,
            seconds=self.now() - started,
            logits=torch.cat(kept_logits, dim=1) if kept_logits else None,
            call_kv_lens=torch.cat(call_kv_lens, dim=1),
        )

    def verify(
        self, state: KVState, pending: torch.Tensor, proposals: Proposals, keys: SampleKeys | None = None
    ) -> Verification:
        """One target forward over [pending, d1..dk]; accept the drafts the token rules accept."""
        started = self.now()
        k, cache_len = proposals.k, state.width
        positions = self.fault.forward_positions(state.next_pos, cache_len, k + 1, "verify")  # [B, k+1]
        query = torch.cat([pending[:, None], proposals.tokens], dim=1)  # [B, k+1]
        target_logits = feed(self.target, state, query, positions)  # [B, k+1, V]
        matched, target_tokens = self.rules.verify(proposals.tokens, proposals.logits, target_logits, keys)
        return Verification(
            positions=positions,
            fed_mask=state.mask,
            cache_len=cache_len,
            target_tokens=target_tokens,
            matched=matched,
            accepted=self.fault.accept(matched, k),
            seconds=self.now() - started,
        )

    def commit(self, batch: Batch, drafts: torch.Tensor, verification: Verification) -> Commit:
        """Each row's accepted drafts plus the target's token after them go to its sequence."""
        seqs = batch.seqs
        perm = self.fault.write_back(batch.regrouped, len(seqs))
        drafts_l, targets_l = drafts.tolist(), verification.target_tokens.tolist()
        emitted: list[list[int]] = []
        bonus: list[int | None] = []
        for row, (dest, accepted) in enumerate(zip(perm, verification.accepted.tolist())):
            proposal = drafts_l[row][:accepted] + [targets_l[row][accepted]]
            out = seqs[dest].append(proposal, self.config.max_new_tokens, self.config.eos_ids)
            emitted.append(out)
            bonus.append(targets_l[row][accepted] if len(out) == len(proposal) else None)
        return Commit(
            emitted=emitted,
            bonus=bonus,
            write_seqs=[seqs[dest].seq_id for dest in perm],
            finish_reasons=[s.finish_reason for s in seqs],
            active=torch.tensor([not s.done for s in seqs], device=self.device),
        )

    def fill_draft_cache(self, state: KVState, proposals: Proposals, accepted: torch.Tensor) -> float:
        """After an all-accepted step the draft lacks KV for its last draft: compute it.

        The draft never fed its own last token, so a row that accepted every draft would resume
        one slot short. One forward for the batch; rows that accepted less drop the slot in
        their plan. Returns the seconds spent (draft time).
        """
        if not (self.fault.draft_catch_up() and bool((accepted == proposals.k).any())):
            return 0.0
        started = self.now()
        positions = self.fault.forward_positions(state.next_pos + proposals.k, state.width, 1, "fill")  # [B, 1]
        feed(self.draft, state, proposals.tokens[:, -1:], positions)
        return self.now() - started

    def plan_cache(self, state: KVState, old_width: int, accepted: torch.Tensor, cache: CacheName) -> CachePlan:
        """How to rebuild one cache of [old slots | slots written this step], for every row.

        The new slots hold the KV of what this step fed; the fault's `plan` decides how many a
        row keeps and attends (correct: accepted + 1) and how far its positions advance.
        """
        written = state.width - old_width  # target: k + 1; draft: k, or k + 1 once filled
        slots = self.fault.plan(accepted, written, leading_zeros(state.mask[:, :old_width]), cache)
        retain, attend = _keep_masks(state.mask, old_width, slots)
        return CachePlan(retain=retain, attend=attend, next_pos=state.next_pos + slots.advance)

    # ------------------------------------------------------------------ bookkeeping

    def _committed(self, seqs: list[SeqState], commit: Commit) -> None:
        """Progress, and the KV check's memory: finished sequences no longer need their expected keys."""
        if self.context.kv_checker is not None:
            for seq in seqs:
                if seq.done:
                    self.context.kv_checker.forget(seq.seq_id)
        if self.context.on_tokens is not None:
            self.context.on_tokens(sum(len(e) for e in commit.emitted))

    def _observe(
        self,
        batch: Batch,
        committed: list[int],
        pending: torch.Tensor,
        proposals: Proposals,
        verification: Verification,
        commit: Commit,
        fill_s: float,
        kv_mismatch: list[int | None] | None,
    ) -> StepObservation:
        return StepObservation(
            step=self.context.step_index,
            batch_id=batch.batch_id,
            seq_ids=[s.seq_id for s in batch.seqs],
            write_seqs=commit.write_seqs,
            committed_before=committed,
            pending=pending,
            drafts=proposals.tokens,
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
            draft_positions=proposals.positions if batch.draft is not None else None,
            draft_call_kv_lens=proposals.call_kv_lens,
            kv_mismatch=kv_mismatch,
            query_causal=getattr(batch.target, "query_causal", None),  # engines that feed a 4-D mask
        )

    def check_kv_content(self, state: KVState, seqs: list[SeqState]) -> list[int | None] | None:
        """On sampled steps: per row, the first attended target slot whose layer-0 key is wrong.

        The expected keys come from the sequences' committed tokens (all but the pending one), not
        from the engine's state, so a wrong move, copy or position shows up here.
        """
        every, context = self.config.kv_check_every, self.context
        if every <= 0 or context.kv_check_unavailable is not None or context.step_index % every or state.cache is None:
            return None
        started = self.now()
        if context.kv_checker is None:
            context.kv_checker = KVContentChecker(self.target, self.config.pad_id)
        contexts = {s.seq_id: (s.prompt_ids + s.output_ids)[:-1] for s in seqs}
        try:
            mismatches = context.kv_checker.first_mismatches(state.cache, state.mask, contexts)
        except Exception as exc:  # noqa: BLE001 - a model the check cannot read must not end the run
            # (layer 0 is not attention, the cache holds no plain keys, the forward refuses the call):
            # the run goes on unchecked and the trace says why; its rows read kv_content_checked false.
            context.kv_check_unavailable = f"{type(exc).__name__}: {str(exc)[:300]}"
            mismatches = None
        context.tracing_seconds += self.now() - started
        return mismatches


def _keep_masks(mask_after: torch.Tensor, old_width: int, plan: SlotPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Which slots of [old | new] survive the rebuild, and which of those stay attended."""
    old = mask_after[:, :old_width]
    new_width = mask_after.shape[1] - old_width
    if plan.absorb_old_pad:
        retain_old = torch.ones_like(old, dtype=torch.bool)
        attend_old = retain_old
    else:
        retain_old = old.cumsum(1) > 0  # strip leading padding, keep any holes after it
        attend_old = old.bool()
    slots = torch.arange(new_width, device=mask_after.device)[None, :]
    retain_new = slots < plan.keep_new[:, None]
    attend_new = slots < plan.attend_new[:, None]
    return torch.cat([retain_old, retain_new], 1), torch.cat([attend_old, attend_new], 1)
