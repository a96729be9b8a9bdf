"""One verify step of batch speculative decoding, shared by every method.

A step reads as four beats, in the order gpt-fast's `speculative_decode` reads, each a method
with a small typed result:

1. `propose` -> `Proposals`: the proposer (`proposers/`: a draft model, a head on the target's
   hidden states, n-gram lookup) proposes k tokens per row, plus, for a tree, an alternative at
   each of the first depths. The baseline (plain batched greedy) has none: `Proposals.none`.
2. `verify` -> `Verification`: the target scores [pending, d1..dk] in one forward; the accept
   rule keeps the longest prefix of drafts that agrees with the target's own choices. EXSPEC's
   batch may hold riders (`Batch.riders`, `mixed.py`): waiting prompts' prefill chunks that the
   same forward carries as extra rows; verification sees only its own rows' logits. A tree is
   verified in one forward with a tree mask; the accepted path is its longest agreeing chain.
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
(`faults/`) each override one decision inside one beat and log their own deviations.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from specviz.engine.batch import Batch, Riders, SeqState
from specviz.engine.clock import now
from specviz.engine.context import EngineConfig, RunContext
from specviz.engine.faults import CacheName
from specviz.engine.keep import keep_masks, kept_nodes, path_first
from specviz.engine.kv.content import KVContentChecker
from specviz.engine.kv.state import CachePlan, KVState, feed, leading_zeros
from specviz.engine.penalty import seen_tokens
from specviz.engine.phases import Commit, StepOutcome, Verification, observe
from specviz.engine.prefill import prefill
from specviz.engine.proposers.base import Proposals, accepted_path
from specviz.engine.proposers.head import HiddenTap
from specviz.engine.rules import SampleKeys, agreeing_prefix
from specviz.trace.recorder import StepObservation

# re-exported: the accept rule of greedy and coupled verification; the proposer's result
__all__ = ["EngineConfig", "Proposals", "RunContext", "StepOutcome", "agreeing_prefix"]


# ---------------------------------------------------------------------- the engine


class Engine:
    """The step and its beats over one `EngineConfig`; bookkeeping goes to the `RunContext`."""

    def __init__(self, config: EngineConfig, context: RunContext | None = None) -> None:
        self.config = config
        self.context = context if context is not None else RunContext()
        self.target, self.draft, self.k, self.device = config.target, config.draft, config.k, config.device
        self.fault, self.rules, self.proposer = config.fault, config.rules, config.proposer
        needs_hidden = self.proposer is not None and self.proposer.needs_hidden
        self.hidden_tap = HiddenTap(self.target) if needs_hidden else None

    def capture_hidden(self) -> Any:
        """A context capturing the target's last hidden states when the proposer reads them."""
        return self.hidden_tap.capture() if self.hidden_tap is not None else nullcontext(None)

    def target_prefilled(self, seqs: list[SeqState], tap: HiddenTap | None, last: list[int]) -> None:
        """Hand the proposer the hidden states of a target prefill (`last[r]`: row r's last column, -1: none)."""
        if tap is not None and tap.hidden is not None:
            self.proposer.prefilled(self, seqs, tap.hidden, last)

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

    def prefill(self, model: Any, seqs: list[SeqState], cache: Any | None = None) -> KVState:
        """Cache every committed token but the pending one, left-padded, positions from lengths,
        whole or in chunks (`prefill.py`). `cache`: an empty cache to write into (placement.py's
        rows of a batch); default: a new one."""
        return prefill(self, model, seqs, cache)

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def step(self, batch: Batch) -> StepOutcome:
        started, seqs, device = self.now(), batch.seqs, self.device
        self.fault.log.begin(self.context.step_index, seqs)
        self.fault.tamper_cache(batch.target)
        kv_mismatch = self.check_kv_content(batch.target, seqs)
        pending = self.fault.pending_tokens(torch.tensor([s.pending for s in seqs], device=device))  # [B]
        committed = [s.committed for s in seqs]
        penalty_lens = [len(s.penalty_history) for s in seqs] if self.rules.penalizes else None
        keys = SampleKeys(
            seq_ids=torch.tensor([s.seq_id for s in seqs], device=device),
            first=torch.tensor(committed, device=device),
            seen=self._seen(seqs),
        )

        # 1. Propose: k draft tokens per row, a chain or a tree (none for the baseline).
        proposals = self.propose(batch, pending, keys)
        # 2. Verify: one target forward over [pending, nodes]; keep the agreeing path.
        verification = self.verify(batch.target, pending, proposals, keys, batch.riders)
        # 3. Commit: each row's accepted drafts plus the bonus go to its sequence.
        commit = self.commit(batch, proposals, verification)
        self._hand_hidden_states(seqs, committed, proposals, verification)
        # 4. Plan the caches. The target's holds [old | pending, nodes]; the draft's [old | pending,
        # d1..d(k-1)] (+ the KV it lacks once filled). No draft cache: nothing to fill or plan.
        target_order = path_first(verification.paths, proposals.tree, verification.accepted.device)
        target_plan = self.plan_cache(
            batch.target, verification.cache_len, verification.accepted, "target", target_order
        )
        draft_plan, fill_s = None, 0.0
        if batch.draft is not None:
            fill_s, draft_order = self.fill_draft_cache(batch.draft, proposals, verification)
            draft_plan = self.plan_cache(
                batch.draft, proposals.cache_width, verification.accepted, "draft", draft_order
            )

        self._committed(seqs, commit)
        observation = observe(
            self.context.step_index, batch, committed, pending, proposals, verification, commit, fill_s, kv_mismatch
        )
        self._prefilled(seqs, observation)
        if penalty_lens is not None:
            observation.penalty_history_lens = penalty_lens
            observation.penalty_added = [seqs[r].penalty_history[penalty_lens[r] :] for r in range(len(seqs))]
        if proposals.tree is not None:
            observation.kept_nodes = kept_nodes(target_plan, verification.cache_len)
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

    def propose(self, batch: Batch, pending: torch.Tensor, keys: SampleKeys | None = None) -> Proposals:
        """The proposer's k drafts per row (plus a tree's alternatives); none for the baseline.

        `keys` name each row's sequence and next logical index, for keyed sampling (greedy ignores them).
        """
        if self.proposer is None:
            return Proposals.none(pending)
        return self.proposer.propose(self, batch, pending, keys, self.config.tree_branches)

    def verify(
        self,
        state: KVState,
        pending: torch.Tensor,
        proposals: Proposals,
        keys: SampleKeys | None = None,
        riders: Riders | None = None,
    ) -> Verification:
        """One target forward over [pending, d1..dk]; accept the drafts the token rules accept.
        `riders`: waiting prompts whose next prefill chunk the forward carries (`mixed.py`)."""
        if proposals.tree is not None:
            return self.verify_tree(state, pending, proposals)
        started = self.now()
        k, cache_len = proposals.k, state.width
        positions = self.fault.forward_positions(state.next_pos, cache_len, k + 1, "verify")  # [B, k+1]
        query = torch.cat([pending[:, None], proposals.tokens], dim=1)  # [B, k+1]
        with self.capture_hidden() as tap:
            if riders:
                target_logits = riders.verify(self.target, state, query, positions, self.context.step_index)
            else:
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
            hidden=tap.hidden if tap is not None else None,
        )

    def verify_tree(self, state: KVState, pending: torch.Tensor, proposals: Proposals) -> Verification:
        """One target forward over the tree [root = pending, nodes...] with a tree mask: each node
        attends the row's committed slots and its own ancestors, at position next_pos + depth.
        The accepted path is the longest root-to-leaf path agreeing with the target (greedy)."""
        started = self.now()
        tree, cache_len = proposals.tree, state.width
        rows = pending.shape[0]
        depths = tree.depth_tensor(rows, pending.device)  # [N], or [B, N] for a top-k tree
        positions = self.fault.tree_positions(state.next_pos, depths)  # [B, N]
        attend = self.fault.tree_attend(tree.attend_mask(rows, pending.device))  # [N, N] or [B, N, N]
        query = torch.cat([pending[:, None], proposals.node_tokens], dim=1)  # [B, N]
        with self.capture_hidden() as tap:
            target_logits = feed(self.target, state, query, positions, query_attend=attend)  # [B, N, V]
        target_tokens = self.rules.select(target_logits, None)  # greedy: tree verification refuses sampling
        nodes_l, targets_l = query.tolist(), target_tokens.tolist()
        paths = [accepted_path(tree, nodes_l[r], targets_l[r], r) for r in range(len(nodes_l))]
        accepted = torch.tensor([len(p) for p in paths], device=pending.device)
        return Verification(
            positions=positions,
            fed_mask=state.mask,
            cache_len=cache_len,
            target_tokens=target_tokens,
            matched=accepted,
            accepted=accepted,
            seconds=self.now() - started,
            paths=paths,
            node_attends=state.query_attends,
            hidden=tap.hidden if tap is not None else None,
        )

    def commit(self, batch: Batch, proposals: Proposals, verification: Verification) -> Commit:
        """Each row's accepted drafts (its path's tokens, in a tree) plus the target's token after
        them go to its sequence."""
        seqs = batch.seqs
        perm = self.fault.write_back(batch.regrouped, len(seqs))
        drafts_l, targets_l = proposals.node_tokens.tolist(), verification.target_tokens.tolist()
        emitted: list[list[int]] = []
        bonus: list[int | None] = []
        for row, (dest, accepted) in enumerate(zip(perm, verification.accepted.tolist())):
            if verification.paths is None:
                proposal = drafts_l[row][:accepted] + [targets_l[row][accepted]]
            else:
                path = verification.paths[row]
                proposal = [drafts_l[row][node - 1] for node in path] + [targets_l[row][verification.last_node(row)]]
            out = seqs[dest].append(proposal, self.config.max_new_tokens, self.config.eos_ids)
            seqs[dest].penalty_history.extend(self.fault.penalty_tokens(row, out))
            emitted.append(out)
            bonus.append(proposal[-1] if len(out) == len(proposal) else None)
        return Commit(
            emitted=emitted,
            bonus=bonus,
            write_seqs=[seqs[dest].seq_id for dest in perm],
            finish_reasons=[s.finish_reason for s in seqs],
            active=torch.tensor([not s.done for s in seqs], device=self.device),
        )

    def fill_draft_cache(
        self, state: KVState, proposals: Proposals, verification: Verification
    ) -> tuple[float, torch.Tensor | None]:
        """Compute the draft KV the accepted path lacks, in one forward for the batch.

        The draft fed [pending, d1..d(k-1)]: a row that accepted every draft lacks d_k's KV, and in
        a tree a row whose path ends on an alternative lacks that alternative's. Rows that need
        nothing drop the filled slot in their plan. Returns the seconds spent (draft time) and, in a
        tree, each row's slot order for the plan (path slots first), else None (the plan keeps a prefix).
        """
        accepted, k = verification.accepted, proposals.k
        if verification.paths is None:
            if not (self.fault.draft_catch_up() and bool((accepted == k).any())):
                return 0.0, None
            started = self.now()
            positions = self.fault.forward_positions(state.next_pos + k, state.width, 1, "fill")  # [B, 1]
            feed(self.draft, state, proposals.tokens[:, -1:], positions)
            return self.now() - started, None
        last = torch.tensor([p[-1] if p else 0 for p in verification.paths], device=accepted.device)
        ends_alt = last > k  # alternatives are leaves of the main chain: a path ends on one, if at all
        lacking = ends_alt | (accepted == k)
        fill = self.fault.draft_catch_up() and bool(lacking.any())
        if fill:
            started = self.now()
            alternative = proposals.node_tokens.gather(1, (last - 1).clamp(min=0)[:, None])[:, 0]
            token = torch.where(ends_alt, alternative, proposals.tokens[:, -1])
            positions = self.fault.forward_positions(state.next_pos + accepted, state.width, 1, "fill")  # [B, 1]
            feed(self.draft, state, token[:, None], positions)
            seconds = self.now() - started
        else:
            seconds = 0.0
        written = k + int(fill)
        # Path slots first: pending and the main drafts up to the path's last main node, then the fill.
        order = []
        for row, path in enumerate(verification.paths):
            main = 1 + sum(1 for node in path if node <= k)  # pending + main-chain nodes kept
            front = list(range(min(main, k))) + ([k] if fill and bool(lacking[row]) else [])
            order.append(front + [s for s in range(written) if s not in front])
        return seconds, torch.tensor(order, dtype=torch.long, device=accepted.device)

    def plan_cache(
        self,
        state: KVState,
        old_width: int,
        accepted: torch.Tensor,
        cache: CacheName,
        order: torch.Tensor | None = None,
    ) -> CachePlan:
        """How to rebuild one cache of [old slots | slots written this step], for every row.

        The new slots hold the KV of what this step fed; the fault's `plan` decides how many a
        row keeps and attends (correct: accepted + 1) and how far its positions advance. `order`
        [B, written] (a tree): the new slots in the order they are kept, the accepted path's
        first; None: the written order (a chain keeps a prefix).
        """
        written = state.width - old_width  # target: k + 1 (tree: N); draft: k, or k + 1 once filled
        slots = self.fault.plan(accepted, written, leading_zeros(state.mask[:, :old_width]), cache)
        retain, attend = keep_masks(state.mask, old_width, slots, order)
        return CachePlan(
            retain=retain, attend=attend, next_pos=state.next_pos + slots.advance, scattered=order is not None
        )

    # ------------------------------------------------------------------ bookkeeping

    def _hand_hidden_states(
        self, seqs: list[SeqState], committed: list[int], proposals: Proposals, verification: Verification
    ) -> None:
        """Head drafting: each row's next carry is the target's hidden state at its last accepted node."""
        if verification.hidden is None:
            return
        tree = proposals.tree
        slots = [verification.last_node(r) for r in range(len(seqs))]
        node_depths = [tree.row_depths(r)[s] if tree else s for r, s in enumerate(slots)]  # a chain's slot is its depth
        self.proposer.verified(self, seqs, committed, verification.hidden, slots, node_depths)

    def _committed(self, seqs: list[SeqState], commit: Commit) -> None:
        """Progress, and the KV check's memory: finished sequences no longer need their expected keys."""
        if self.context.kv_checker is not None:
            for seq in seqs:
                if seq.done:
                    self.context.kv_checker.forget(seq.seq_id)
        if self.context.on_tokens is not None:
            self.context.on_tokens(sum(len(e) for e in commit.emitted))

    def _prefilled(self, seqs: list[SeqState], observation: StepObservation) -> None:
        """Rows whose sequence was prefilled in chunks since its last step record what was fed."""
        if not self.context.prefills:
            return
        records = [self.context.prefills.pop(s.seq_id, None) for s in seqs]
        observation.prefill_chunks = [r.chunks if r is not None else None for r in records]
        observation.draft_prefill_tokens = [r.draft_fed if r is not None else None for r in records]

    def _seen(self, seqs: list[SeqState]) -> torch.Tensor | None:
        """[B, V] each row's penalty history as a token set; None without a repetition penalty."""
        if not self.rules.penalizes:
            return None
        vocab = self.target.get_output_embeddings().weight.shape[0]
        return seen_tokens([s.penalty_history for s in seqs], vocab, self.device)

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
