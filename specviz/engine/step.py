"""One verify step of batch speculative decoding, shared by every method.

A step: the draft proposes k tokens per row (k forwards of one token on its own cache), the
target scores [pending, d1..dk] in one forward, greedy verification keeps the longest agreeing
prefix plus one bonus token, results are written to the sequences, and the caller rebuilds the
caches (EQSPEC realigns the batch, EXSPEC splits it back into the pool). Plain batched greedy is
the same step with k = 0 and no draft.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specviz.engine.faults import Fault, SlotPlan
from specviz.engine.kv import KVState, feed, leading_zeros
from specviz.trace.recorder import NullRecorder, Recorder, StepObservation


@dataclass
class Sequence:
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
    seqs: list[Sequence]
    target: KVState
    draft: KVState | None
    batch_id: int = 0
    regrouped: bool = False  # composition changed since this batch's previous step
    grouped: bool | None = None  # exspec: an equal-length group (no padding)


@dataclass
class StepOutcome:
    """What a step produced, plus what the caller needs to rebuild the caches."""

    observation: StepObservation
    active_rows: torch.Tensor  # rows whose own sequence continues
    target_retain: torch.Tensor
    target_attend: torch.Tensor
    target_next_pos: torch.Tensor
    draft_retain: torch.Tensor | None
    draft_attend: torch.Tensor | None
    draft_next_pos: torch.Tensor | None
    started: float  # perf_counter at step start, to close the total time after realignment


@dataclass
class Engine:
    target: Any
    draft: Any | None
    k: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    pad_id: int
    device: torch.device
    fault: Fault = field(default_factory=Fault)
    recorder: Recorder | None = None
    on_tokens: Callable[[int], None] | None = None  # progress: tokens emitted this step
    step_index: int = 0
    fault_events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.recorder is None:  # engines built outside `run` (tests, benchmarks) record nothing
            self.recorder = NullRecorder(header=None)

    # ------------------------------------------------------------------ timing helpers

    def now(self) -> float:
        """Wall clock, device synchronised so phase timings mean what they say."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    # ------------------------------------------------------------------ prefill

    @torch.no_grad()
    def prefill(self, model: Any, seqs: list[Sequence]) -> KVState:
        """Cache every committed token but the pending one, left-padded, positions from lengths."""
        contexts = [s.prompt_ids + s.output_ids[:-1] if s.output_ids else s.prompt_ids[:-1] for s in seqs]
        width = max(len(c) for c in contexts)
        lengths = torch.tensor([len(c) for c in contexts], device=self.device)
        state = KVState(
            cache=None,
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
        return state

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def step(self, batch: Batch) -> StepOutcome:
        started = self.now()
        fault, k = self.fault, self.k
        seqs = batch.seqs
        size = len(seqs)
        for row, seq in enumerate(seqs):
            if seq.taint is not None:
                self._log(self.step_index, row, seq.seq_id, seq.taint)
                seq.taint = None
        pending = torch.tensor([s.pending for s in seqs], device=self.device)
        committed = [s.committed for s in seqs]
        target_pad = leading_zeros(batch.target.mask)

        draft_kv_len = None
        draft_width_before = batch.draft.width if batch.draft is not None else 0
        drafts = torch.zeros(size, 0, dtype=torch.long, device=self.device)
        if k > 0:
            draft_kv_len = batch.draft.mask.sum(1)
            drafts = self._propose(batch.draft, pending)
        after_draft = self.now()

        query = torch.cat([pending[:, None], drafts], dim=1)
        cache_len = batch.target.width
        positions = fault.verify_positions(batch.target.next_pos, cache_len, k + 1)
        correct = batch.target.next_pos[:, None] + torch.arange(k + 1, device=self.device)
        for row in (positions != correct).any(1).nonzero().flatten().tolist():
            self._log(self.step_index, row, seqs[row].seq_id, "position IDs differ from the row's real-token count")
        logits = feed(self.target, batch.target, query, positions)
        target_tokens = logits.argmax(-1)
        matched = (drafts == target_tokens[:, :k]).long().cumprod(1).sum(1)
        accepted = fault.accept(matched, k)
        for row in (accepted != matched).nonzero().flatten().tolist():
            self._log(self.step_index, row, seqs[row].seq_id, "accepted a draft the target rejected")
        after_verify = self.now()

        emitted, bonus, write_seqs = self._write_back(batch, drafts, target_tokens, accepted)
        catch_up_s = 0.0
        caught_up = k > 0 and fault.draft_catch_up() and bool((accepted == k).any())
        if caught_up:
            before = self.now()
            positions_last = fault.verify_positions(batch.draft.next_pos + k, batch.draft.width, 1)
            feed(self.draft, batch.draft, drafts[:, -1:], positions_last)
            catch_up_s = self.now() - before

        active = torch.tensor([not s.done for s in seqs], device=self.device)
        active_rows = active.nonzero().flatten()
        target_plan = fault.plan(accepted, k + 1, target_pad)
        t_retain, t_attend = _keep_masks(batch.target.mask, cache_len, target_plan)
        self._taint(seqs, target_plan.altered, "target cache or positions rebuilt wrongly")
        outcome = StepOutcome(
            observation=StepObservation(
                step=self.step_index,
                batch_id=batch.batch_id,
                seq_ids=[s.seq_id for s in seqs],
                write_seqs=write_seqs,
                committed_before=committed,
                pending=pending,
                drafts=drafts,
                target_tokens=target_tokens,
                accepted=accepted,
                bonus=bonus,
                emitted=emitted,
                positions=positions,
                fed_mask=batch.target.mask,
                cache_len=cache_len,
                draft_kv_len=draft_kv_len,
                left_pad_after=[None] * size,
                finish_reasons=[s.finish_reason for s in seqs],
                grouped=batch.grouped,
                draft_ms=(after_draft - started + catch_up_s) * 1000,
                verify_ms=(after_verify - after_draft) * 1000,
                align_ms=0.0,
                total_ms=0.0,
            ),
            active_rows=active_rows,
            target_retain=t_retain,
            target_attend=t_attend,
            target_next_pos=(batch.target.next_pos + target_plan.advance)[active_rows],
            draft_retain=None,
            draft_attend=None,
            draft_next_pos=None,
            started=started,
        )
        if k > 0:
            available = k + (1 if caught_up else 0)
            draft_plan = fault.plan(accepted, available, leading_zeros(batch.draft.mask[:, :draft_width_before]))
            short = (accepted + 1 > available) & active
            self._taint(seqs, draft_plan.altered | short, "draft cache missing KV")
            d_retain, d_attend = _keep_masks(batch.draft.mask, draft_width_before, draft_plan)
            outcome.draft_retain, outcome.draft_attend = d_retain, d_attend
            outcome.draft_next_pos = (batch.draft.next_pos + draft_plan.advance)[active_rows]
        if self.on_tokens is not None:
            self.on_tokens(sum(len(e) for e in emitted))
        return outcome

    def finish_step(self, outcome: StepOutcome, left_pad_after: list[int | None], align_started: float) -> None:
        """Close the timings and hand the step to the recorder."""
        end = self.now()
        obs = outcome.observation
        obs.left_pad_after = left_pad_after
        obs.align_ms = (end - align_started) * 1000
        obs.total_ms = (end - outcome.started) * 1000
        self.recorder.record_step(obs)
        self.step_index += 1

    # ------------------------------------------------------------------ pieces

    def _propose(self, state: KVState, pending: torch.Tensor) -> torch.Tensor:
        """k greedy draft tokens, one forward each on the draft's own cache."""
        tokens = pending[:, None]
        proposals = []
        for j in range(self.k):
            positions = self.fault.verify_positions(state.next_pos + j, state.width, 1)
            logits = feed(self.draft, state, tokens, positions)
            tokens = logits[:, -1].argmax(-1, keepdim=True)
            proposals.append(tokens)
        return torch.cat(proposals, dim=1)

    def _write_back(
        self, batch: Batch, drafts: torch.Tensor, target_tokens: torch.Tensor, accepted: torch.Tensor
    ) -> tuple[list[list[int]], list[int | None], list[int]]:
        seqs = batch.seqs
        perm = self.fault.write_back(batch.regrouped, len(seqs))
        drafts_l, targets_l, accepted_l = drafts.tolist(), target_tokens.tolist(), accepted.tolist()
        emitted: list[list[int]] = []
        bonus: list[int | None] = []
        for row, dest in enumerate(perm):
            a = accepted_l[row]
            proposal = drafts_l[row][:a] + [targets_l[row][a]]
            out = seqs[dest].append(proposal, self.max_new_tokens, self.eos_ids)
            emitted.append(out)
            bonus.append(targets_l[row][a] if len(out) == len(proposal) else None)
            if dest != row:
                self._log(self.step_index, row, seqs[row].seq_id, f"results written to sequence {seqs[dest].seq_id}")
        return emitted, bonus, [seqs[d].seq_id for d in perm]

    def _taint(self, seqs: list[Sequence], altered: torch.Tensor, what: str) -> None:
        for row in altered.nonzero().flatten().tolist():
            if not seqs[row].done and seqs[row].taint is None:
                seqs[row].taint = what

    def _log(self, step: int, row: int, seq_id: int, what: str) -> None:
        self.fault_events.append({"step": step, "row": row, "seq_id": seq_id, "fault": self.fault.name, "what": what})


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
