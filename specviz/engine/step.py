"""One verify step of batch speculative decoding, shared by every method.

A step runs four phases, in the order gpt-fast's `speculative_decode` reads (draft, verify,
accept, fill the draft cache), each a method with a small typed result:

1. `propose` -> `Proposals`: the draft proposes k tokens per row, one forward of one token each
   on its own cache. The baseline (plain batched greedy) has no draft: `Proposals.none`.
2. `verify` -> `Verification`: the target scores [pending, d1..dk] in one forward; the accept
   rule keeps the longest prefix of drafts that agrees with the target's own choices.
3. `commit` -> `Commit`: the accepted drafts plus one target token (the bonus) are appended to
   the sequences.
4. `plan_cache` -> `CachePlan`, once per cache: which slots each continuing row keeps and where
   its positions resume. Before the draft's plan, `fill_draft_cache` computes the KV the draft
   lacks after an all-accepted step. The baseline has no draft cache, so no draft plan.

The caller applies the plans (EQSPEC realigns the batch, EXSPEC splits it back into the pool).
Tokens are chosen by one set of rules, `Engine.rules` (`rules.py`: greedy by default, or coupled
or rejection sampling keyed by (seed, seq_id, logical index)), used by both the draft and the
target, so verification compares like with like. Fault hooks
(`faults.py`) each override one decision inside one phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specviz.engine.faults import Fault, SlotPlan
from specviz.engine.kv.content import KVContentChecker
from specviz.engine.kv.headroom import with_headroom
from specviz.engine.kv.state import CachePlan, KVState, feed, leading_zeros
from specviz.engine.rules import SampleKeys, TokenRules, agreeing_prefix
from specviz.trace.recorder import NullRecorder, Recorder, StepObservation

__all__ = ["agreeing_prefix"]  # re-exported: the accept rule of greedy and coupled verification


@dataclass
class SeqState:
    """A prompt being decoded. Committed tokens = prompt + output; the last is pending."""

    seq_id: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    taint: str | None = None  # set by a fault that altered this sequence's cache/positions

    @property
    def committed(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def pending(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def append(self, proposal: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> list[int]:
        """Append at most the remaining budget, stopping after the first EOS."""
        emitted = proposal[: max(0, max_new_tokens - len(self.output_ids))]
        for i, token in enumerate(emitted):
            if token in eos_ids:
                emitted = emitted[: i + 1]
                self.finish_reason = "eos"
                break
        self.output_ids.extend(emitted)
        if self.finish_reason is None and len(self.output_ids) >= max_new_tokens:
            self.finish_reason = "length"
        return emitted


@dataclass
class Batch:
    seqs: list[SeqState]
    target: KVState
    draft: KVState | None  # None: no draft model (the baseline)
    batch_id: int = 0
    regrouped: bool = False  # composition changed since this batch's previous step
    grouped: bool | None = None  # exspec: an equal-length group (no padding)


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
    started: float  # perf_counter at step start, to close the total time after realignment


# ---------------------------------------------------------------------- the engine


@dataclass
class Engine:
    target: Any
    draft: Any | None  # None: the baseline (then k = 0)
    k: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    pad_id: int
    device: torch.device
    fault: Fault = field(default_factory=Fault)
    rules: TokenRules = field(default_factory=TokenRules)
    recorder: Recorder | None = None
    on_tokens: Callable[[int], None] | None = None  # progress: tokens emitted this step
    step_index: int = 0
    fault_events: list[dict[str, Any]] = field(default_factory=list)
    kv_check_every: int = 0  # check the target's KV content every N steps (0: never)
    kv_checker: KVContentChecker | None = None
    # Seconds spent tracing (the recorder's `record_step` and the sampled KV-content check): the
    # cost of a traced run measured inside it, free of the run-to-run noise of comparing two runs.
    tracing_seconds: float = 0.0
    kv_check_unavailable: str | None = None  # why the KV-content check was switched off mid-run

    @property
    def cache_headroom(self) -> int:
        """Free slots a cache keeps past its width (headroom.py): a step feeds each cache at most
        k + 1 slots (the draft's catch-up token plus its proposals; the verify block)."""
        return self.k + 2

    def __post_init__(self) -> None:
        if (self.draft is None) != (self.k == 0):
            raise ValueError(f"a draft model needs k >= 1 and k >= 1 needs a draft model (k={self.k})")
        if self.recorder is None:  # engines built outside `run` (tests, benchmarks) record nothing
            self.recorder = NullRecorder(header=None)

    def now(self) -> float:
        """Wall clock, device synchronised so phase timings mean what they say."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @torch.no_grad()
    def prefill(self, model: Any, seqs: list[SeqState], cache: Any | None = None) -> KVState:
        """Cache every committed token but the pending one, left-padded, positions from lengths.

        `cache`: an empty cache to write into (assemble.py's rows of a batch); default: a new one."""
        contexts = [s.prompt_ids + s.output_ids[:-1] if s.output_ids else s.prompt_ids[:-1] for s in seqs]
        width = max(len(c) for c in contexts)
        lengths = torch.tensor([len(c) for c in contexts], device=self.device)
        state = KVState(
            cache=cache,
            mask=torch.zeros(len(seqs), 0, dtype=torch.long, device=self.device),
            next_pos=lengths.clone(),
        )
        if width == 0:
            return state
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(seqs), width, dtype=torch.long, device=self.device)
        for row, context in enumerate(contexts):
            if context:
                ids[row, width - len(context) :] = torch.tensor(context, device=self.device)
                mask[row, width - len(context) :] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        feed(model, state, ids, positions, query_mask=mask)
        state.cache = with_headroom(state.cache, self.cache_headroom)
        return state

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def step(self, batch: Batch) -> StepOutcome:
        started = self.now()
        seqs = batch.seqs
        self._report_taints(seqs)
        tampered = self.fault.tamper_cache(batch.target)
        if tampered is not None:
            self._log(tampered, seqs[tampered].seq_id, f"KV slots overwritten from row {tampered + 1}")
        kv_mismatch = self.check_kv_content(batch.target, seqs)
        pending = torch.tensor([s.pending for s in seqs], device=self.device)
        committed = [s.committed for s in seqs]

        # 1-3. Draft (nothing for the baseline), verify and accept, write the results.
        keys = SampleKeys(
            seq_ids=torch.tensor([s.seq_id for s in seqs], device=self.device),
            first=torch.tensor(committed, device=self.device),
        )
        proposals = Proposals.none(pending) if batch.draft is None else self.propose(batch.draft, pending, keys)
        if batch.draft is not None:
            believed = batch.draft.next_pos[:, None] + torch.arange(proposals.k, device=self.device)
            self._report_rows(proposals.positions.ne(believed).any(1), seqs, "draft fed positions off its count")
        verification = self.verify(batch.target, pending, proposals, seqs, keys)
        commit = self.commit(batch, proposals.tokens, verification)
        if self.kv_checker is not None:  # finished sequences no longer need their expected keys
            for seq in seqs:
                if seq.done:
                    self.kv_checker.forget(seq.seq_id)

        # 4. Plan the caches. The target's holds [old | pending, d1..dk]; the draft's [old | d1..dk]
        # (+ the last draft's KV once filled). The baseline has no draft cache to fill or plan.
        target_plan = self.plan_cache(batch.target, verification.cache_len, verification.accepted)
        self._taint(seqs, target_plan.altered, "target cache or positions rebuilt wrongly")
        draft_plan, fill_s = None, 0.0
        if batch.draft is not None:
            fill_s = self.fill_draft_cache(batch.draft, proposals, verification.accepted)
            draft_plan = self.plan_cache(batch.draft, proposals.cache_width, verification.accepted)
            self._taint(seqs, draft_plan.altered, "draft cache missing KV")

        if self.on_tokens is not None:
            self.on_tokens(sum(len(e) for e in commit.emitted))
        rows = commit.active_rows
        return StepOutcome(
            observation=self._observe(batch, committed, pending, proposals, verification, commit, fill_s, kv_mismatch),
            active_rows=rows,
            target_plan=target_plan,
            draft_plan=draft_plan,
            started=started,
        )

    def finish_step(self, outcome: StepOutcome, left_pad_after: list[int | None], align_started: float) -> None:
        """Close the timings and hand the step to the recorder."""
        end = self.now()
        obs = outcome.observation
        obs.left_pad_after = left_pad_after
        obs.align_ms = (end - align_started) * 1000
        obs.total_ms = (end - outcome.started) * 1000
        self.recorder.record_step(obs)
        self.tracing_seconds += self.now() - end
        self.step_index += 1

    # ------------------------------------------------------------------ the phases

    def propose(self, state: KVState, pending: torch.Tensor, keys: SampleKeys | None = None) -> Proposals:
        """k draft tokens per row, one forward each on the draft's own cache.

        `keys` name each row's sequence and next logical index, for keyed sampling (greedy ignores them).
        """
        started = self.now()
        kv_len, cache_width = state.mask.sum(1), state.width
        tokens = pending[:, None]
        drafted, fed_positions, kept_logits, call_kv_lens = [], [], [], []
        for j in range(self.k):
            positions = self.fault.draft_positions(self.fault.forward_positions(state.next_pos + j, state.width, 1))
            call_kv_lens.append(state.mask.sum(1, keepdim=True))  # the call's one query attends these
            logits = feed(self.draft, state, tokens, positions)[:, -1:]
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
        self,
        state: KVState,
        pending: torch.Tensor,
        proposals: Proposals,
        seqs: list[SeqState],
        keys: SampleKeys | None = None,
    ) -> Verification:
        """One target forward over [pending, d1..dk]; accept the drafts the token rules accept."""
        started = self.now()
        k, cache_len = proposals.k, state.width
        positions = self.fault.forward_positions(state.next_pos, cache_len, k + 1)
        correct = state.next_pos[:, None] + torch.arange(k + 1, device=self.device)
        self._report_rows(positions.ne(correct).any(1), seqs, "position IDs differ from the row's real-token count")
        query = torch.cat([pending[:, None], proposals.tokens], dim=1)
        target_logits = feed(self.target, state, query, positions)
        matched, target_tokens = self.rules.verify(proposals.tokens, proposals.logits, target_logits, keys)
        accepted = self.fault.accept(matched, k)
        self._report_rows(accepted != matched, seqs, "accepted a draft the target rejected")
        return Verification(
            positions=positions,
            fed_mask=state.mask,
            cache_len=cache_len,
            target_tokens=target_tokens,
            matched=matched,
            accepted=accepted,
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
            out = seqs[dest].append(proposal, self.max_new_tokens, self.eos_ids)
            emitted.append(out)
            bonus.append(targets_l[row][accepted] if len(out) == len(proposal) else None)
            if dest != row:
                self._log(row, seqs[row].seq_id, f"results written to sequence {seqs[dest].seq_id}")
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
        positions = self.fault.forward_positions(state.next_pos + proposals.k, state.width, 1)
        feed(self.draft, state, proposals.tokens[:, -1:], positions)
        return self.now() - started

    def plan_cache(self, state: KVState, old_width: int, accepted: torch.Tensor) -> CachePlan:
        """How to rebuild one cache of [old slots | slots written this step], for every row.

        The new slots hold the KV of what this step fed; the fault's `plan` decides how many a
        row keeps and attends (correct: accepted + 1) and how far its positions advance.
        """
        written = state.width - old_width  # target: k + 1; draft: k, or k + 1 once filled
        slots = self.fault.plan(accepted, written, leading_zeros(state.mask[:, :old_width]))
        retain, attend = _keep_masks(state.mask, old_width, slots)
        missing = accepted + 1 > written  # a kept token whose KV was never computed
        return CachePlan(
            retain=retain, attend=attend, next_pos=state.next_pos + slots.advance, altered=slots.altered | missing
        )

    # ------------------------------------------------------------------ bookkeeping

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
            step=self.step_index,
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
        if self.kv_check_every <= 0 or self.step_index % self.kv_check_every or state.cache is None:
            return None
        started = self.now()
        if self.kv_checker is None:
            self.kv_checker = KVContentChecker(self.target, self.pad_id)
        contexts = {s.seq_id: (s.prompt_ids + s.output_ids)[:-1] for s in seqs}
        try:
            mismatches = self.kv_checker.first_mismatches(state.cache, state.mask, contexts)
        except Exception as exc:  # noqa: BLE001 - a model the check cannot read must not end the run
            # (layer 0 is not attention, the cache holds no plain keys, the forward refuses the call):
            # the run goes on unchecked and the trace says why; its rows read kv_content_checked false.
            self.kv_check_every = 0
            self.kv_check_unavailable = f"{type(exc).__name__}: {str(exc)[:300]}"
            mismatches = None
        self.tracing_seconds += self.now() - started
        return mismatches

    def _report_taints(self, seqs: list[SeqState]) -> None:
        """Log, at the step that feeds it, each sequence a fault altered on an earlier step."""
        for row, seq in enumerate(seqs):
            if seq.taint is not None:
                self._log(row, seq.seq_id, seq.taint)
                seq.taint = None

    def _taint(self, seqs: list[SeqState], altered: torch.Tensor, what: str) -> None:
        for row in altered.nonzero().flatten().tolist():
            if not seqs[row].done and seqs[row].taint is None:
                seqs[row].taint = what

    def _report_rows(self, rows: torch.Tensor, seqs: list[SeqState], what: str) -> None:
        for row in rows.nonzero().flatten().tolist():
            self._log(row, seqs[row].seq_id, what)

    def _log(self, row: int, seq_id: int, what: str) -> None:
        event = {"step": self.step_index, "row": row, "seq_id": seq_id, "fault": self.fault.name, "what": what}
        self.fault_events.append(event)


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
