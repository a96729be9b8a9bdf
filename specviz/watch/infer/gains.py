"""`follow.Follower`'s reading of what each step gave a sequence (its next row's context, the
tokens a cacheless draft re-reads, or the greedy rule at its last step), and of how sequences end
(EOS, a shared budget, or each its own where the engine stopped feeding it)."""

from __future__ import annotations

from dataclasses import replace

from specviz.analysis.tree_checks import depths_of
from specviz.watch import tree
from specviz.watch.attribution import Emit
from specviz.watch.calls import argmax_at, attended_ids, attends_cache, draft_free_query, last_slot
from specviz.watch.credit import row_tokens
from specviz.watch.infer.decoded import decoded_tail, takes
from specviz.watch.infer.followed import RowView, Seq, Step
from specviz.watch.infer.match import Sampled
from specviz.watch.infer.tree_gain import step_gain, tree_of


class Gains:
    """Mixed into `Follower` (its calls, sequences, emits and reader)."""

    def _greedy_drafts(self, j: int) -> None:
        """`Sampled` where the draft calls before target call j, with those before them, show a drafter
        that does not feed its own choice: a cacheless draft row that the next draft call extends by
        one token that is not the draft's argmax at the row's last slot, twice at least. A greedy
        drafter feeds its argmax there, whatever the engine's row bookkeeping; a sampling one (with
        rejection sampling) seldom does, and its target commits drafts and residual tokens that are
        not its argmax either: read as greedy, a correct run would read desync."""
        drafts = [i for i in range(self.prev + 1, j) if self.calls[i].role == "draft"]
        for a, b in zip(drafts, drafts[1:]):
            first, then = self.calls[a], self.calls[b]
            for r in range(min(first.batch_size, then.batch_size)):
                before, after = attended_ids(first, r), attended_ids(then, r)
                chose = argmax_at(first, r, last_slot(first, r))
                if chose is not None and after[:-1] == before and not attends_cache(then, r):
                    self.drafted[0] += 1
                    self.drafted[1] += chose != after[-1]
        seen, other = self.drafted
        if other >= 2:
            why = f"{other} of {seen} draft tokens fed are not the draft's argmax: the engine samples"
            raise Sampled(
                f"{why} (or processes its logits): its rows are not followed by greedy acceptance; watch it"
                " with specviz.watch(..., temperature=)"
            )

    def _step_tokens(self, s: Seq) -> Step:
        """The sequence's open step: its drafts, the target's argmax and its pending token."""
        i, ri = s.step
        call = self.calls[i]
        rq = self.read(i, ri, s.id)
        if self.draft_free and not rq.drafts:  # the drafts are what follows the committed tokens
            rq = draft_free_query(call, ri, s.context) or rq
        drafts, targets = row_tokens(call, ri, rq)
        pending, parents = call.input_ids[ri][rq.pending], tree_of(call, ri)
        if parents is not None:  # a tree row, read by the chain rules along its greedy path
            drafts, targets = tree.greedy_chain(parents, [pending, *drafts], targets)
        return Step(drafts, targets, pending)

    @staticmethod
    def _chunk(step: Step, v: RowView, known: int) -> bool:
        """Was the sequence's open step (the call after a prefill that gave no token, its "drafts"
        read from no draft call) a chunk of its prompt? Its whole query was kept (the context grew
        by all of it), the row is not fed what a greedy step would have given (the target's choice
        after the drafts it agrees with: a step with stale KV keeps its rejected slots too), or it
        is fed the target's choice after the whole query while that query is no greedy pick (its
        last chunk, which gave the token fed now; where both readings give one token, the position
        fed to it tells: a step's pending token sits after what it committed, fewer than it
        attends when stale slots stay attended; fed anywhere else (after all it attends, a chunk's
        place, or where neither reading puts it: a position bug either way) or not fed, the
        reading that explains the context's growth without a bug). A chunk short of the prompt's
        end whose next chunk starts with the greedy pick is told the same way (none fed: the step
        reading)."""
        d = len(step.drafts)
        if not step.targets or not d or v.context - known != d:
            return False  # (a one-token chunk is not told from a step the row's token does not continue)
        if v.token == step.targets[d]:  # the target's choice after the whole query: its last chunk, if no greedy pick
            return step.agreed < d and (v.token != step.choice or v.position != known + step.agreed)
        # Short of the prompt's end: fed no choice of the target, or its choice (the next chunk starts
        # with it) where a greedy step keeps fewer slots than the whole query and the position fed is
        # not the step's (a step's pending token sits after what it committed; one fed after the
        # whole query, or where neither reading puts it, a position bug either way, leaves the mask
        # to tell, which kept the whole query; with no position fed, the step reading stands).
        return v.token != step.choice or step.agreed < d and v.position not in (-1, known + step.agreed)

    def _chunked(self, s: Seq, v: RowView, j: int, r: int) -> None:
        """The open step was a prompt chunk (`_chunk`): its query joins the prompt. The chunk that
        reached the prompt's end was a step that gave the token fed now; an earlier one gave none,
        and this call feeds the next part of the prompt (its first token read as pending)."""
        step = self._step_tokens(s)
        s.context += step.drafts
        s.prompt_len = len(s.context)
        if v.token == step.targets[len(step.drafts)]:  # the last chunk: it chose the token fed now
            self._said_last_chunk(*s.step)
            self._commit(s, [v.token])
            s.step, s.in_prompt = (j, r), False
            return
        s.context.append(v.token)
        s.prompt_len += 1
        s.step = (j, r)

    def _said_last_chunk(self, i: int, r: int) -> None:
        """Row r of call i was its prompt's last chunk: say so in its map, as `w.batch(drafts=0)`
        would (its last token pending, the rest context), for the steps read from it after
        (`steps.build_steps`), which read a draft-free row's drafts after its first slot when that
        slot holds the last committed token: a chunk can start with the token its prompt ends with."""
        call = self.calls[i]
        if call.map is None or len(call.map.segments) != call.batch_size:
            return
        segments = list(call.map.segments)
        segments[r] = replace(segments[r], drafts=0)
        call.map = replace(call.map, segments=tuple(segments))

    def _gained(self, s: Seq, v: RowView) -> list[int]:
        """Tokens the sequence's open step committed, read from its next row `v`."""
        if v.context >= 0:  # a tree step (`tree_gain.step_gain`)
            read = step_gain(
                self.calls, s.step, s.at, self.read(*s.step, s.id), v.rq, s.context, v.context + 1 - len(s.context)
            )
            if isinstance(read, str):  # which path it kept is not told: its step on is unreadable
                self.calls[s.step[0]].mark_unreadable(read)
            elif read is not None:
                return read
        step = self._step_tokens(s)
        if self.draft_free and v.whole:
            # A row re-fed with its own drafts, which only the greedy rule tells apart (no draft
            # model): what a greedy engine keeps.
            return step.greedy
        reread = self._reread(s, v)
        if reread is not None:
            return reread
        grown = v.context + 1 - len(s.context)
        if 0 <= grown <= len(v.query):
            return v.query[len(v.query) - grown :]  # re-fed tokens (a recompute loop) show themselves
        took = grown - 1 if 1 <= grown <= len(step.drafts) + 1 else step.agreed
        if v.token == step.choice and not (v.position == v.context and step.could_end(took, v.token)):
            # Fed the greedy continuation, yet the context grew past what greedy acceptance
            # allows: the tokens say what was committed (the command reads greedy engines), the
            # KV check judges the context (a rejected slot left attended, another row's slot).
            # Not where the position fed sits after the whole grown context and the token is the
            # target's choice after that many drafts (as often as not the same token): position
            # and mask then both say the step kept them (a draft accepted against the target).
            took = min(took, step.agreed)
        return step.drafts[:took] + [v.token]

    def _draft_fed(self, v: RowView) -> list[int] | None:
        """What the row's first draft call attended, where that draft keeps no cache: it is fed the
        whole sequence up to the pending token. None: no such draft call."""
        if not v.rq.chain:
            return None
        call, row = v.rq.chain[0]
        return None if attends_cache(self.calls[call], row) else attended_ids(self.calls[call], row)

    def _reread(self, s: Seq, v: RowView) -> list[int] | None:
        """The tokens gained, as the row's first draft call re-read them (`_draft_fed`), which says
        what was committed whatever the target's context (a stale, lost or foreign slot) counts."""
        fed, n = self._draft_fed(v), len(s.context)
        if v.whole or fed is None:
            return None  # a row that re-feeds its context shows its tokens itself
        return fed[n:] if len(fed) > n and fed[:n] == s.context and fed[-1] == v.token else None

    def _by_token(self, s: Seq, v: RowView) -> list[int]:
        """Tokens of a step whose next row's context cannot be trusted: the drafts before the slot
        whose argmax the row is fed (the greedy one if it is), then that token."""
        step = self._step_tokens(s)
        if v.token == step.choice:
            took = step.agreed
        elif v.token in step.targets:
            took = step.targets.index(v.token)
        else:
            took = step.drafts.index(v.token)  # no bonus kept: the last draft taken is fed
        return step.drafts[:took] + [v.token]

    def _commit(self, s: Seq, tokens: list[int]) -> Emit | None:
        """The open step's tokens, up to the first EOS; none, or an EOS, finishes the sequence."""
        i = s.step[0]
        cut = next((n + 1 for n, t in enumerate(tokens) if t in self.eos), None)
        tokens = tokens[:cut]
        s.finished = cut is not None or not tokens
        if not tokens:
            return None
        s.context += tokens
        emit = Emit(s.id, tokens, "eos" if cut else None, after=i + 1, at=self.calls[i].ended)
        self.emits.append(emit)
        return emit

    def _close(self, s: Seq) -> None:
        """A sequence no later call continues: its last step gained what a greedy engine keeps."""
        if s.opened and self.was_step.get(s.origin[0], True):
            s.opened, s.step = False, s.origin
        if s.refed:  # (never an opened one: only a step's row is re-fed)
            self._stopped.append(s)
        elif not s.opened:
            emit = self._commit(s, self._step_tokens(s).greedy)
            if emit is not None:
                self._assumed.append(emit)
                if emit.finish_reason is None:
                    self._greedy_ends[s.id] = emit
        s.finished = True

    def take_decoded(self, decoded: list[tuple[list[int], int | None]], pad: int | None = None) -> None:
        """Each last step read as greedy whose tokens the script's decoded outputs show
        (`infer.decoded`: one tail, one the step could have committed): those tokens instead, seen,
        so no longer read as greedy. Run after `run`, whose budget reading they do not change."""
        if self.unfollowed:
            return  # reading stopped: a last step read is not the sequence's last
        kept = {id(e) for e in self.emits}
        for emit in [e for e in self._assumed if id(e) in kept]:
            s = self.seqs[emit.seq_id]
            del s.context[len(s.context) - len(emit.tokens) :]  # as at the step (a draft-free step reads it)
            step = self._step_tokens(s)
            tail = decoded_tail(decoded, s.context[: s.prompt_len], s.context[s.prompt_len :], self.eos, pad)
            greedy = step.greedy[: next((n + 1 for n, t in enumerate(step.greedy) if t in self.eos), None)]
            if tail is None or not takes(tail, emit.tokens, greedy, self._most(s, step), self.eos):
                s.context += emit.tokens
                continue
            s.context += tail
            ended = "eos" if tail[-1] in self.eos else "length" if emit.finish_reason == "eos" else None
            emit.tokens, emit.finish_reason = list(tail), ended or emit.finish_reason
            self._assumed = [e for e in self._assumed if e is not emit]

    def _most(self, s: Seq, step: Step) -> int:
        """The most tokens the sequence's open `step` could commit: its drafts (a tree's deepest path) + 1."""
        parents = tree_of(self.calls[s.step[0]], s.step[1])
        if parents is not None:
            return max(depths_of(parents), default=0) + 1
        return len(step.drafts) + 1

    def _cut_to_budget(self) -> None:
        """Endings by length share one budget (`max_new_tokens`), which the engine never declares.
        A sequence fed again without growing ended there (its length is the budget); one whose last
        step was never fed back (it left the batch, or the run ended) ended within that step's
        greedy tokens, which an engine cuts at the budget. When one budget fits them all (the
        length of those fed again, else the shortest greedy end), the greedy ends are cut to it,
        and, when a sequence ended exactly at it, so is a row read past it only as
        repeats of its token at the budget: a finished row fed that token again, where it is also
        its argmax, reads as growing, which no correct engine under that budget did; a row that
        had reached it when a call made the last step of rows still below it was a finished row
        fed along (its greedy end is dropped). Anything else read past it, or reading stopped
        early: no one budget, nothing is cut."""
        if self.unfollowed:
            return  # reading stopped: the last steps read are not endings
        ends = [(self._output(self.seqs[i]), len(e.tokens)) for i, e in self._greedy_ends.items()]
        stopped = {self._output(s) for s in self._stopped}
        ranges = [(n - k + 1, n) for n, k in ends]  # the output lengths each greedy end may stop at
        budget = shared_budget(ranges, stopped)
        # A sequence that ended by EOS after more tokens than the budget was stepped past it: not one
        # budget (an engine with a budget per request; cutting the others to it would be a guess).
        if budget is None or any(self._output(s) > budget and self._ended_by_eos(s) for s in self.seqs):
            self._own_budgets()
            return
        # Pinned: a sequence ended exactly there (fed again, or a last step of one token).
        pinned = bool(stopped) or (budget, budget) in ranges
        over = [s for s in self.seqs if self._output(s) > budget and not self._ended_by_eos(s)]
        if not all(self._cuttable(s, budget, pinned) for s in over):
            self._own_budgets()
            return
        for s in over:
            self._trim(s, self._output(s) - budget)

    def _own_budgets(self) -> None:
        """No one budget fits the endings: each sequence the engine stopped feeding without an EOS
        ended at its own budget, where it stopped (an engine with a budget per request)."""
        for s in self.seqs:
            ends = self._emits_of(s)
            if ends and not self._ended_by_eos(s):
                ends[-1].finish_reason = "length"

    def _output(self, s: Seq) -> int:
        return len(s.context) - s.prompt_len

    def _emits_of(self, s: Seq) -> list[Emit]:
        return [e for e in self.emits if e.seq_id == s.id]

    def _ended_by_eos(self, s: Seq) -> bool:
        return any(e.finish_reason == "eos" for e in self._emits_of(s))

    def _cuttable(self, s: Seq, budget: int, pinned: bool) -> bool:
        """Past `budget` lies only the sequence's greedy end, or (when a sequence ended exactly at
        the budget, `pinned`) repeats of its token at the budget, one a call, then its greedy end.
        A sequence that repeats one token while it decodes is not cut on a budget only bounded
        from above."""
        end = self._greedy_ends.get(s.id)
        read = s.context[s.prompt_len : len(s.context) - (len(end.tokens) if end else 0)]
        if len(read) <= budget:
            return len(read) < budget or end is not None and self._fed_along(end, budget)
        # A finished row fed along gains one token a call: a row that gained more at a call past
        # the budget accepted drafts there, so it was decoding, under a budget of its own.
        past = [e for e in self._emits_of(s) if e is not end][budget - len(read) :]
        repeats = all(t == read[budget - 1] for t in read[budget:]) and all(len(e.tokens) == 1 for e in past)
        return pinned and budget > 0 and repeats

    def _fed_along(self, end: Emit, budget: int) -> bool:
        """The call of this greedy end also made the last step of a sequence below the budget: a
        finished row fed along with the rows still decoding (a loop that re-feeds every row)."""
        return any(
            e.after == end.after and self._output(self.seqs[g]) - len(e.tokens) < budget
            for g, e in self._greedy_ends.items()
        )

    def _trim(self, s: Seq, extra: int) -> None:
        """Drop the sequence's last `extra` tokens, from its last emits."""
        del s.context[-extra:]
        for emit in reversed(self._emits_of(s)):
            cut = min(extra, len(emit.tokens))
            del emit.tokens[len(emit.tokens) - cut :]
            extra -= cut
            if not emit.tokens:
                self.emits.remove(emit)
            if not extra:
                return


def shared_budget(ranges: list[tuple[int, int]], lengths: set[int]) -> int | None:
    """The one output length every ending by length stopped at: equal to every length in `lengths`,
    else the smallest range end; and within every (low, high) range that starts at or below it (a
    range above it was read past it). None when there is none."""
    if len(lengths) > 1 or not (lengths or ranges):
        return None
    budget = next(iter(lengths)) if lengths else min(hi for _, hi in ranges)
    return budget if all(budget <= hi for lo, hi in ranges if lo <= budget) else None
