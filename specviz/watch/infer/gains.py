"""`follow.Follower`'s reading of what each step gave a sequence (its next row, a cacheless draft's
re-read, a tree's kept nodes or chosen path, the greedy rule at its last step) and of how sequences
end (EOS, one shared budget, or each its own)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specviz.analysis.tree_checks import depths_of
from specviz.watch import tree
from specviz.watch.attribution import Emit
from specviz.watch.calls import argmax_at, attended_ids, draft_free_query, row_tokens
from specviz.watch.infer.decoded import decoded_tail, eos_cut, takes
from specviz.watch.infer.match import RowView, Sampled, Seq, Step
from specviz.watch.tree import kept_nodes


class Gains:
    """Mixed into `Follower` (its calls, sequences, emits and reader)."""

    def _greedy_drafts(self, j: int) -> None:
        """`Sampled` from the verify where the drafter was seen not to feed its own choice (`calls.sampled_drafts`)."""
        if self.sampled is not None and j >= self.sampled[0]:
            raise Sampled(
                f"{self.sampled[1]}: its rows are not followed by greedy acceptance; watch it with"
                " specviz.watch(..., temperature=)"
            )

    def _step_tokens(self, s: Seq) -> Step:
        """The sequence's open step: its drafts, the target's argmax and its pending token."""
        i, ri = s.step
        call = self.calls[i]
        rq = self.read(i, ri, s.id)
        if self.draft_free and not rq.drafts:  # the drafts are what follows the committed tokens
            rq = draft_free_query(call, ri, s.context) or rq
        drafts, targets = row_tokens(call, ri, rq)
        pending, parents = call.input_ids[ri][rq.pending], call.trees[ri]
        most = len(drafts) + 1
        if parents is not None:  # a tree row, read by the chain rules along its greedy path
            drafts, targets = tree.greedy_chain(parents, [pending, *drafts], targets)
            most = max(depths_of(parents), default=0) + 1
        return Step(drafts, targets, pending, most)

    @staticmethod
    def _chunk(step: Step, v: RowView, known: int) -> bool:
        """Was the open step after a token-less prefill a prompt chunk (docs/watch-command.md)?"""
        d = len(step.drafts)
        if not step.targets or not d or v.context - known != d:
            return False  # (a one-token chunk is not told from a step the row's token does not continue)
        # Fed no greedy pick; or, where a greedy step keeps fewer slots than the whole query, fed at
        # another position than the step's: its last chunk (fed the target's choice after the whole
        # query) or one short of the prompt's end (where no position fed, the step reading stands).
        off = v.position != known + step.agreed
        return v.token != step.choice or step.agreed < d and off and (v.token == step.targets[d] or v.position != -1)

    def _chunked(self, s: Seq, v: RowView, j: int, r: int) -> None:
        """The open step was a prompt chunk: its query joins the prompt (the last chunk gave the token fed)."""
        step = self._step_tokens(s)
        s.context += step.drafts
        s.prompt_len = len(s.context)
        if v.token == step.targets[len(step.drafts)]:  # the last chunk: it chose the token fed now
            call, row = self.calls[s.step[0]], s.step[1]  # its map says so, as `w.batch(drafts=0)` would
            if len(call.map.segments) == call.batch_size:  # (materialized: every call has a map)
                segments = list(call.map.segments)
                segments[row] = replace(segments[row], drafts=0)
                call.map = replace(call.map, segments=tuple(segments))
            self._commit(s, [v.token])
            s.step, s.in_prompt, s.chunk_end = (j, r), False, True
            return
        self._feeds_prompt(s, v, j, r)

    def _feeds_prompt(self, s: Seq, v: RowView, j: int, r: int) -> None:
        """Row r of call j feeds the sequence's next prompt token (pending): its open step is in its prompt."""
        s.context.append(v.token)
        s.prompt_len += 1
        s.step, s.in_prompt = (j, r), True

    def _gained(self, s: Seq, v: RowView) -> list[int]:
        """Tokens the sequence's open step committed, read from its next row `v`."""
        if v.context >= 0:  # a tree step (`step_gain`)
            read = step_gain(
                self.calls, s.step, s.at, self.read(*s.step, s.id), v.rq, s.context, v.context + 1 - len(s.context)
            )
            if isinstance(read, str):  # which path it kept is not told: its step on is unreadable
                self.calls[s.step[0]].mark_unreadable(read)
            elif read is not None:
                return read
        step = self._step_tokens(s)
        if self.draft_free and v.whole:  # re-fed with its own drafts: only the greedy rule tells them apart
            return step.greedy
        fed, n = self._draft_fed(v), len(s.context)  # what the row's first cacheless draft call re-read
        if not v.whole and len(fed) > n and fed[:n] == s.context and fed[-1] == v.token:
            return fed[n:]
        grown = v.context + 1 - len(s.context)
        # Re-fed tokens (a recompute loop) show themselves; a row over a cache that grew by nothing
        # lost a slot (the KV check flags it): what it was fed is read as below.
        if 0 < grown <= len(v.query) or grown == 0 and v.whole:
            return v.query[len(v.query) - grown :]
        took = grown - 1 if 1 <= grown <= len(step.drafts) + 1 else step.agreed
        if v.token == step.choice and not (v.position == v.context and step.could_end(took, v.token)):
            # Fed the greedy continuation past what greedy acceptance allows: the tokens say what was committed
            # (the KV check judges the context), unless position and mask both say the step kept them.
            took = min(took, step.agreed)
        return step.drafts[:took] + [v.token]

    def _draft_fed(self, v: RowView) -> list[int]:
        """What the row's first draft call attended where it keeps no cache ([]: no such call)."""
        if not v.rq.chain:
            return []
        call, row = v.rq.chain[0]
        return [] if self.calls[call].views[row].attends_cache() else attended_ids(self.calls[call], row)

    def _by_token(self, s: Seq, v: RowView) -> list[int]:
        """The step's tokens by the row's pending token alone (the drafts before the slot that chose it)."""
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
        cut = eos_cut(tokens, self.eos)
        tokens = tokens[:cut]
        s.finished = cut is not None or not tokens
        if not tokens:
            return None
        s.context += tokens
        emit = Emit(s.id, tokens, "eos" if cut else None, after=i + 1, at=self.calls[i].ended)
        self.emits.append(emit)
        return emit

    def _close(self, s: Seq) -> None:
        """A sequence no later call continues: its last step (an opened one's first call, where it was a
        step: `Seq.step` is still its origin) gained what a greedy engine keeps."""
        if s.refed:  # (never an opened one: only a step's row is re-fed)
            self._stopped.append(s)
        elif not s.opened or self.was_step.get(s.origin[0], True):
            emit = self._commit(s, self._step_tokens(s).greedy)
            if emit is not None:
                self._assumed[id(emit)] = emit
        # Finished, no longer out: its context now holds that last step (`_again` adds it to an out one's).
        s.finished, s.out = True, False

    def take_decoded(self, decoded: list[tuple[list[int], int | None]], pad: int | None = None) -> None:
        """Last steps read as greedy that the script's decoded outputs show (`infer.decoded`): those tokens."""
        if self.unfollowed:
            return  # reading stopped: a last step read is not the sequence's last
        for emit in list(self._assumed.values()):
            s = self.seqs[emit.seq_id]
            del s.context[len(s.context) - len(emit.tokens) :]  # as at the step (a draft-free step reads it)
            step = self._step_tokens(s)
            tail = decoded_tail(decoded, s.context[: s.prompt_len], s.context[s.prompt_len :], self.eos, pad)
            greedy = step.greedy[: eos_cut(step.greedy, self.eos)]
            if tail is None or not takes(tail, emit.tokens, greedy, step.most, self.eos):
                s.context += emit.tokens
                continue
            s.context += tail
            ended = "eos" if tail[-1] in self.eos else "length" if emit.finish_reason == "eos" else emit.finish_reason
            emit.tokens, emit.finish_reason = list(tail), ended
            del self._assumed[id(emit)]

    def _cut_to_budget(self) -> None:
        """Cut what lies past the one budget that fits all endings by length, else each keeps its own."""
        if self.unfollowed:
            return  # reading stopped: the last steps read are not endings
        # Sequence -> its last step read as greedy, no EOS (as `_close` left them: nothing is cut yet).
        greedy = {e.seq_id: e for e in self._assumed.values() if e.finish_reason is None}
        ends = [(self._output(self.seqs[i]), len(e.tokens)) for i, e in greedy.items()]  # (output, last step)
        stopped = {self._output(s) for s in self._stopped}
        budget = shared_budget([n for n, _ in ends], stopped)
        if budget is not None:
            over = [s for s in self.seqs if self._output(s) > budget]
            # Pinned: a sequence ended exactly there (fed again, or a last step of one token).
            pinned = bool(stopped) or (budget, 1) in ends
            # One that ended by EOS past the budget was stepped past it: a budget per request, not one.
            if all(not self._ended_by_eos(s) and self._cuttable(s, budget, pinned, greedy) for s in over):
                for s in over:
                    self._trim(s, self._output(s) - budget)
                return
        for s in self.seqs:  # no one budget fits: each that ended without an EOS ended at its own budget
            emits = self._emits_of(s)
            if emits and not self._ended_by_eos(s):
                emits[-1].finish_reason = "length"

    def _output(self, s: Seq) -> int:
        return len(s.context) - s.prompt_len

    def _emits_of(self, s: Seq) -> list[Emit]:
        return [e for e in self.emits if e.seq_id == s.id]

    def _ended_by_eos(self, s: Seq) -> bool:
        return any(e.finish_reason == "eos" for e in self._emits_of(s))

    def _cuttable(self, s: Seq, budget: int, pinned: bool, greedy: dict[int, Emit]) -> bool:
        """Past `budget` lies only the greedy end, or (`pinned`) one-a-call repeats of the budget's token."""
        end = greedy.get(s.id, _NO_END)
        read = s.context[s.prompt_len : len(s.context) - len(end.tokens)]
        if len(read) <= budget:
            # (`s` is past the budget: `end` is its end) Or its greedy end's call also made the last step
            # of a sequence below the budget: a finished row fed along.
            return len(read) < budget or any(
                e.after == end.after and self._output(self.seqs[g]) - len(e.tokens) < budget for g, e in greedy.items()
            )
        # A finished row fed along gains one token a call: a row that gained more at a call past
        # the budget accepted drafts there, so it was decoding, under a budget of its own.
        past = [e for e in self._emits_of(s) if e is not end][budget - len(read) :]
        repeats = all(t == read[budget - 1] for t in read[budget:]) and all(len(e.tokens) == 1 for e in past)
        return pinned and budget > 0 and repeats

    def _trim(self, s: Seq, extra: int) -> None:
        """Drop the sequence's last `extra` tokens, from its last emits."""
        del s.context[-extra:]
        for emit in reversed(self._emits_of(s)):
            cut = min(extra, len(emit.tokens))
            del emit.tokens[len(emit.tokens) - cut :]
            extra -= cut  # (no emit is empty: past `extra`, nothing is cut)
            if not emit.tokens:
                self.emits.remove(emit)
                self._assumed.pop(id(emit), None)


_NO_END = Emit(-1, [], None, -1, 0.0)  # a sequence's greedy end where none was read


def shared_budget(ends: list[int], lengths: set[int]) -> int | None:
    """The one output length the fed-again `lengths` (else the shortest greedy end) share, no end below; or None."""
    budgets = sorted(lengths) or sorted(ends)[:1]
    if len(budgets) != 1 or any(n < budgets[0] for n in ends):
        return None
    return budgets[0]


def step_gain(
    calls: list[Any], step: tuple[int, int], at: tuple[int, int], rq: Any, later_rq: Any, context: list[int], grown: int
) -> list[int] | str | None:
    """A tree step's tokens as the next call (`at`) shows them: the kept nodes, when the root and a chain,
    then the fed token; else the path of `grown` - 1 nodes whose end chose the fed token (a cacheless
    draft's feed breaks a tie, else greedy acceptance). A string: why it cannot be told (unreadable,
    never guessed); None: no tree row, or nothing a path explains."""
    (i, ri), (j, rj) = step, at
    call = calls[i]
    parents = call.trees[ri]
    if parents is None:
        return None
    nodes = call.input_ids[ri][rq.pending : rq.pending + len(parents)]
    token = calls[j].input_ids[rj][later_rq.pending]
    chose = [argmax_at(call, ri, rq.pending + n) for n in range(len(parents))]
    kept = kept_nodes(call, ri, rq, calls[j], rj, later_rq)
    if kept is not None:
        if kept != [0, *_path_to(parents, max(kept, default=0))]:  # not the root and a path down (kept ascends)
            return None
        # The token fed says what was committed where the kept path's end did not choose it and the
        # greedy path of as many nodes did: KV kept off the committed path (the check flags it).
        greedy = tree.greedy_path(parents, nodes, chose)[: len(kept)]
        if chose[kept[-1]] != token and len(greedy) == len(kept) and chose[greedy[-1]] == token:
            kept = greedy
        return [nodes[n] for n in kept[1:]] + [token]
    depths = depths_of(parents)
    ends = [n for n, d in enumerate(depths) if d == grown - 1]
    if not ends:
        return None
    chosen = [n for n in ends if chose[n] == token]
    paths = {tuple(nodes[a] for a in _path_to(parents, n)) for n in (chosen or ends)}
    if len(paths) > 1:  # a cacheless draft re-reads the committed tokens: the path it was fed
        feeds = [attended_ids(c, r) for c in calls[i + 1 : j] if of_draft_model(c) for r in range(c.batch_size)]
        told = {p for p in paths if [*context, *p, token] in feeds}
        # Else greedy acceptance, the rule the command reads (two ends often choose alike after a
        # compacted cache): the path of the target's own choices, where it is one of them.
        paths = told or paths & {tuple(nodes[n] for n in tree.greedy_path(parents, nodes, chose)[1:grown])}
    if len(paths) != 1:
        return f"tree step of target call {i}, row {ri}: no one path of {grown - 1} nodes fits what was fed next"
    return [*paths.pop(), token]


def of_draft_model(call: Any) -> bool:
    """A draft model's call (a draft head's is fed no tokens of its own)."""
    return call.role == "draft" and not call.drafter


def _path_to(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to `node` (root excluded)."""
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
