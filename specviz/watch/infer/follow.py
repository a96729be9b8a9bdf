"""Following sequences through an unmodified engine's target calls (`specviz watch --`): which
sequence each row holds, matched by its attended context, and what each step gained (the rules, their
tie-breakers and where reading stops: docs/watch-command.md)."""

from __future__ import annotations

from functools import cache

from specviz.watch.attribution import Emit
from specviz.watch.calls import CallReader, argmax_at, attended_ids, first_slot_query, sampled_drafts
from specviz.watch.infer.gains import Gains, of_draft_model
from specviz.watch.infer.match import IDLE, NEW, Ambiguous, Assignments, RowView, Seq, Unfollowed
from specviz.watch.record import CallRecord
from specviz.watch.tensor_reads import shared_slots


class Follower(Assignments, Gains):
    """Walks the target calls in order; `prompts`, `emits` and each call's rows once `run` returns."""

    def __init__(self, calls: list[CallRecord], eos: frozenset[int], notes: list[str]) -> None:
        self.calls, self.eos, self.notes = calls, eos, notes
        self.targets = [i for i, c in enumerate(calls) if c.role == "target"]  # (the others: "draft")
        ends = zip(self.targets, self.targets[1:] + [len(calls)])  # target -> end of its drafts
        # Target call -> what its draft rows that keep no cache attended (`_opens`: a newcomer re-read).
        rows = {j: [(d, r) for d in calls[j + 1 : end] for r in range(d.batch_size)] for j, end in ends}
        self.cacheless = {
            j: [attended_ids(d, r) for d, r in dr if not d.views[r].attends_cache()] for j, dr in rows.items()
        }
        self.read = CallReader(calls)
        # No draft model (prompt lookup, n-gram, extra heads): drafts follow the committed tokens.
        self.draft_free = not any(of_draft_model(c) for c in calls)
        self.seqs: list[Seq] = []
        self.emits: list[Emit] = []
        self.rows: dict[int, tuple[int, ...]] = {}  # target call -> sequence per row (< 0: none)
        self.was_step: dict[int, bool] = {}  # opening call -> it was a step for its newcomers
        self.unfollowed: list[str] = []  # why reading stopped, for the report's skipped checks
        self.prev: int | None = None
        self.prefixes: dict[int, list[int]] = {}  # a shared prefix's length -> its tokens (one per length)
        self.last_on: dict[int | None, int] = {}  # cache fed (`CallRecord.cache_id`) -> the last call fed it
        self._assumed: dict[int, Emit] = {}  # id -> a last step read as greedy (EOS or not), not seen nor cut away
        self._stopped: list[Seq] = []  # finished by being fed again without growing
        self._view = cache(self._read_view)  # (j, r, seq) -> RowView
        self.sampled = sampled_drafts(calls, self.targets)  # (verify, why) where the drafter samples

    @property
    def prompts(self) -> list[list[int]]:
        # A row with no token in the first call that nothing continued: a placeholder prompt.
        return [s.context[: s.prompt_len] or [0] for s in self.seqs]

    @property
    def read_as_greedy(self) -> dict[int, int]:
        """Sequence -> tokens of its last step no later call showed (read as greedy, not seen)."""
        return {e.seq_id: len(e.tokens) for e in self._assumed.values()}

    @property
    def _live(self) -> list[Seq]:
        return [s for s in self.seqs if not s.finished and not s.out]

    def run(self) -> None:
        for n, j in enumerate(self.targets):
            try:
                self._call(j)
            except Unfollowed as why:
                unread = len(self.targets) - n
                message = f"{why}: {unread} target calls from call {j} on are not read (declare rows with w.rows)"
                self.notes.append(message)
                self.unfollowed.append(message)  # for the report's skipped checks
                # Its rows may be half read: no step is read from it (nor its sequences' greedy ends).
                self.calls[j].mark_unreadable(message)
                break
        for s in [s for s in self.seqs if not s.finished]:  # (with those left out since: `Seq.out`)
            self._close(s)
        self._cut_to_budget()
        self.emits.sort(key=lambda e: (e.after, e.seq_id))

    def _call(self, j: int) -> None:
        """Assign call j's rows to sequences and read what their steps gained (`Unfollowed`: why not)."""
        call = self.calls[j]
        if self.prev is None:  # every row is new, even one with no token yet (a one-token prompt's prefill)
            assigned = {r: (NEW, "new") for r in range(call.batch_size)}
        else:
            # The rows continued are those of the last call fed the same cache (micro-batches taking
            # turns, rows verified one at a time), else of the last call.
            self.prev = self.last_on.get(call.cache_id, self.prev)
            assigned = self._assign(j, [r for r in range(call.batch_size) if any(call.views[r].flags)])
        before = {s.id: s.at[0] for s in self.seqs}
        self._apply(j, assigned)
        self.rows[j] = tuple(self._row_id(j, r, assigned) for r in range(call.batch_size))
        self._leave(j, assigned, before)
        call.rows = self.rows[j]  # later reads search draft calls back to each sequence's own calls
        self.prev = self.last_on[call.cache_id] = j

    def _row_id(self, j: int, r: int, assigned: dict[int, tuple[int, str]]) -> int:
        seq = assigned.get(r, (IDLE, ""))[0]
        if seq >= 0:
            return seq
        same = self.calls[self.prev].batch_size == self.calls[j].batch_size
        kept = self.rows[self.prev][r] if same else -1
        # An idle row keeps its sequence where no other row holds it: a finished one, or a live one idle
        # for a call (a static slot while another is prefilled).
        placed = {seq for seq, _ in assigned.values()}
        return kept if kept >= 0 and (self.seqs[kept].finished or kept not in placed) else -1 - r

    def _assign(self, j: int, active: list[int]) -> dict[int, tuple[int, str]]:
        """Row -> (sequence or NEW or IDLE, how it fits) for the call's active rows (`Unfollowed`: why none)."""
        self._greedy_drafts(j)  # (`Sampled`: a drafter that samples, reading stops)
        if self.calls[j].batch_size != self.calls[self.prev].batch_size:
            return self._unique(j, active)
        kept = self._kept(j, active)
        if kept is not None:
            return kept
        try:
            found = self._unique(j, active)
        except Ambiguous:
            # A cached row that starts no sequence, fits none and is no finished one fed again: no
            # assignment explains every row, as below; else several fit, never guessed, reading stops.
            if any(not self._fits(j, r) and not self._starts(j, r) and not self._again(j, r) for r in active):
                return self._legacy(active)
            raise
        except Unfollowed:
            return self._legacy(active)
        # Some rows new in a batch of unchanged size without a cache is rather a context fed wrong (a mask
        # that attends padding): it keeps its order. (Every row new: a second decode of fresh prompts; a
        # new row over a cache `_starts` a sequence, `_unique`: a newcomer prefilled among decoding rows.)
        news = [s == NEW for s, _ in found.values()]
        if self.calls[j].cache_width == 0 and any(news) and not all(news):
            return self._legacy(active)
        return found

    def _fits(self, j: int, r: int) -> dict[int, str]:
        """Live sequence -> how row r of call j continues it (a shared cache: those it attends most)."""
        mine = self._most_attended(j, r)
        seqs = [] if self._opens(j, r) else self._live
        # Those it attends most first; a chunk is the reading of last resort: another's fit, then theirs.
        ours = self._chain_fits(j, r, [s for s in seqs if s.id in mine])
        if plain := _plain(ours):
            return plain
        if len(mine) == 1 and not ours:  # the one it attends most, which its chain does not fit
            (s,) = mine
            seq = self.seqs[s]
            if seq.opened:
                return {s: "open"}
            if self._weak(seq, self._view(j, r, s)):
                return {s: "weak"}
        out = self._chain_fits(j, r, seqs)
        return _plain(out) or ours or out

    def _chain_fits(self, j: int, r: int, seqs: list[Seq]) -> dict[int, str]:
        """Sequence -> how row r of call j continues it by its chain, for those of `seqs` it fits."""
        fits = {s.id: self._fit(s, self._view(j, r, s.id)) for s in seqs}
        return {s: how for s, how in fits.items() if how is not None}

    def _most_attended(self, j: int, r: int) -> set[int]:
        """The live sequences whose slots row r of call j attends most (none: not a shared cache)."""
        held = self.calls[j].held  # one entry per row of a packed call (`hooks.segment_slots`)
        if held is None:
            return set()
        before = {s.id: (self.calls[s.at[0]].held, s.at[1]) for s in self._live}
        overlap = {s: shared_slots(held[r][0], slots[at][1]) for s, (slots, at) in before.items() if slots is not None}
        most = max(overlap.values(), default=0)
        return {s for s, n in overlap.items() if n == most > 0}

    def _kept(self, j: int, active: list[int]) -> dict[int, tuple[int, str]] | None:
        """Every active row continues the sequence its row held before: rows kept their order."""
        held = self.rows[self.prev]
        out: dict[int, tuple[int, str]] = {}
        idle = []
        for r in active:
            seq = held[r]
            if seq < 0:
                return None  # the row held no sequence to continue
            if self.seqs[seq].finished:
                if self.calls[j].cache_width > 0 and self._starts(j, r):
                    return None  # a newcomer prefilled in a finished row's place
                out[r] = (IDLE, "idle")
                idle.append(r)
                continue
            how = None if self._opens(j, r) else self._fit(self.seqs[seq], self._view(j, r, seq))
            mine = self._most_attended(j, r)
            if how is None or mine and seq not in mine:
                return None  # not its chain, or (a shared cache) other sequences' slots
            out[r] = (seq, how)
        # A finished row's place may hold a live sequence moved there: then the rows did move.
        placed = {seq for seq, _ in out.values()}
        moved = [s for s in self._live if s.id not in placed]
        if any(self._fit(s, self._view(j, r, s.id)) for r in idle for s in moved):
            return None
        return out

    def _legacy(self, active: list[int]) -> dict[int, tuple[int, str]]:
        """Rows keep their order whatever they were fed (a bug that breaks the chain is flagged at its row)."""
        held = [(r, self.rows[self.prev][r]) for r in active]
        return {r: (IDLE, "idle") if s < 0 or self.seqs[s].finished else (s, self.seqs[s].growth) for r, s in held}

    def _read_view(self, j: int, r: int, seq: int) -> RowView:
        """Row r of call j read as sequence `seq` (NEW: a new one); kept per (j, r, seq) as `_view`."""
        call = self.calls[j]
        # A known sequence is read from its first token (`Seq.base`); a new one by an id of its own.
        stale, shift, known = (0, 0, len(self.seqs) + r) if seq < 0 else (*self.seqs[seq].base, seq)
        rq = self.read(j, r, known)
        if self.draft_free and call.views[r].attends_cache():  # its first real slot is the pending token
            rq = first_slot_query(call, r) or rq
        context = call.views[r].before(rq.pending)
        return RowView(
            rq=rq,
            token=call.input_ids[r][rq.pending],
            context=context - stale if context >= 0 else context,
            query=attended_ids(call, r, rq.pending),
            whole=not call.views[r].attends_cache(),
            position=int(call.positions[r][rq.pending]) - shift if call.positions_fed else -1,
        )

    def _fit(self, s: Seq, v: RowView) -> str | None:
        """How the row continues `s` (None: it cannot hold `s`); docs/watch-command.md lists the rules."""
        if v.whole:
            if v.query == s.context:
                return "same"
            return s.growth if v.query[: len(s.context)] == s.context else None
        fed = self._draft_fed(v)  # a cacheless draft's re-read of the row's context, if any, extends `s`'s
        if fed and fed[: len(s.context)] != s.context:
            return None
        if s.opened:
            m = len(s.context)
            if v.context < 0:
                return "open"
            # Or fewer slots than its context, fed at its length: a hole in its cache (the KV check flags it).
            grown = m <= v.context <= m + self.read(*s.origin, s.id).drafts and v.refeeds(s.context)
            return "open" if grown or 0 < v.context != m == v.position else None
        step = self._step_tokens(s)
        if s.in_prompt and not self.read(*s.step, s.id).chain and self._chunk(step, v, len(s.context)):
            return "chunk"
        if v.context < 0:  # no mask to count: the greedy continuation only
            return "grow" if v.token == step.choice else None
        grown = v.context + 1 - len(s.context)
        if step.could_end(grown - 1, v.token):
            return "grow"
        # A finished row fed its last token again (with or without its cache growing).
        return "again" if 0 <= grown <= 1 and v.token == step.pending else None

    def _again(self, j: int, r: int) -> bool:
        """A row that feeds a finished (or out: after its greedy last step) sequence again: a cached row
        its last token, a cacheless row its whole context unchanged (a finished row fed along in a
        recompute loop, not a newcomer: one whose prompt ends alike is longer or differs before)."""
        ends = [
            (s, s.context + self._step_tokens(s).greedy if s.out else s.context)
            for s in self.seqs
            if s.finished or s.out
        ]
        return any(
            v.query == c if v.whole else c[-1:] == [v.token] and (v.context < 0 or v.context >= len(c) - 1)
            for s, c in ends
            for v in (self._view(j, r, s.id),)
        )

    def _apply(self, j: int, assigned: dict[int, tuple[int, str]]) -> None:
        opening: dict[int, list[tuple[Seq, RowView]]] = {}  # opening call -> its newcomers held here
        for r, (seq, how) in sorted(assigned.items()):
            if how == "open":
                s = self.seqs[seq]
                opening.setdefault(s.origin[0], []).append((s, self._view(j, r, seq)))
        for o in sorted(opening.keys() - self.was_step.keys()):
            self.was_step[o] = self._opened_by_step(o, opening[o])
        for r, (seq, how) in sorted(assigned.items()):
            if seq == NEW:
                assigned[r] = (self._new(j, r), how)
            elif seq >= 0:
                self._continue(self.seqs[seq], j, r, how)

    def _new(self, j: int, r: int) -> int:
        fed = any(self.calls[j].views[r].flags)  # (a row with no token yet: a one-token prompt's prefill)
        query, base = (self._view(j, r, NEW).query, self._base(j, r)) if fed else ([], (0, 0))
        prefix, seq = self._shared_prefix(j, base)
        if prefix:  # its prompt starts with the prefix its first token attends: no stale KV
            query, base = [*prefix, *query], (0, 0)
        new = Seq(seq, list(query), len(query), origin=(j, r), at=(j, r), step=(j, r), base=base)
        self.seqs[seq : seq + 1] = [new]  # (a new id appends; the prefix's own id is taken by its first row)
        return seq

    def _shared_prefix(self, j: int, base: tuple[int, int]) -> tuple[list[int], int]:
        """A prefix prefilled once and expanded to several rows (prefix caching): the tokens of the one
        sequence no call continued that a newcomer's first token attends whole, at its length, and
        the id the newcomer takes (the prefix's own, for its first row: it is no sequence of its own)."""
        stale = base[0]  # (fed at any position: positions that do not count the prefix are a position bug)
        if not stale:
            return [], len(self.seqs)
        if stale in self.prefixes:
            return self.prefixes[stale], len(self.seqs)
        # Prefilled on its own (a one-row call: before j, whose rows share it) and never continued (still
        # at its first call, so opened); shared: two rows or more start there (one alone, or over a
        # sequence prefilled among others, is a newcomer over another request's KV).
        alone = [s for s in self._live if s.at == s.origin and self.calls[s.origin[0]].batch_size == 1]
        whole = [s for s in alone if len(s.context) == stale]
        call = self.calls[j]
        sharing = [q for q in range(call.batch_size) if any(call.views[q].flags) and self._base(j, q) == base]
        if len(whole) != 1 or len(sharing) < 2:
            return [], len(self.seqs)
        self.prefixes[stale] = list(whole[0].context)
        return whole[0].context, whole[0].id

    def _continue(self, s: Seq, j: int, r: int, how: str) -> None:
        """Row r of call j holds `s` as `_fit` read it (only an opened sequence is read "open")."""
        s.at, s.out, v = (j, r), False, self._view(j, r, s.id)
        read = {"same": self._refed, "chunk": self._chunked, "again": self._fed_again, "open": self._opened}
        read["grow"] = lambda *at: self._step(*at, self._gained(s, v))
        read["weak"] = lambda *at: self._step(*at, self._by_token(s, v))
        read[how](s, v, j, r)

    def _opened(self, s: Seq, v: RowView, j: int, r: int) -> None:
        s.opened = False
        if not self.was_step[s.origin[0]] or not s.context:
            self._feeds_prompt(s, v, j, r)  # its first call prefilled all but the last prompt token
        else:  # (no drafts verified there: a prefill whose choice this row is fed, `Seq.chunk_end`)
            self._step(s, v, j, r, self._gained(s, v), not self.read(*s.origin, s.id).drafts)

    def _step(self, s: Seq, v: RowView, j: int, r: int, tokens: list[int], prefilled: bool = False) -> None:
        """The open step committed `tokens` (`Unfollowed`: refused drafts kept, yet the prompt's next chunk too)."""
        # (no argmax kept: nothing was refused, and `_chunk` reads no chunk)
        refused = s.chunk_end and len(tokens) - 1 > (step := self._step_tokens(s)).agreed
        if refused and self._chunk(step, v, len(s.context)):
            why = f"row {r} of target call {j}: where sequence {s.id}'s prompt ends is not told (a prefill"
            raise Unfollowed(f"{why} chunk that ends on the target's choice, or a step that kept refused drafts)")
        self._commit(s, tokens)
        s.step, s.refed, s.in_prompt, s.chunk_end = (j, r), False, False, prefilled

    def _refed(self, s: Seq, v: RowView, j: int, r: int) -> None:
        s.refed = not s.opened

    def _fed_again(self, s: Seq, v: RowView, j: int, r: int) -> None:
        s.finished = True  # fed again without growing: the engine keeps computing a finished row
        self._stopped.append(s)

    def _opened_by_step(self, o: int, members: list[tuple[Seq, RowView]]) -> bool:
        """Was call o a step for its newcomers: it verified drafts, or the next call feeds its argmax?"""
        call = self.calls[o]
        if call.argmax is None:
            return True
        for s, v in sorted(members, key=lambda m: m[0].origin):
            row = s.origin[1]
            if self.read(o, row, s.id).drafts:
                return True
            if argmax_at(call, row, call.last_slots[row]) != v.token:
                return False
        return True

    def _leave(self, j: int, assigned: dict[int, tuple[int, str]], before: dict[int, int]) -> None:
        """Sequences this call leaves out while holding others of their last call are out (`Seq.out`)."""
        # (None for a new row or a marker; never call j: no sequence was at it before it was read)
        calls_held = {before.get(seq) for seq, _ in assigned.values()}
        for s in self._live:  # one this call holds, or a newcomer, is at this call now: never out
            s.out = s.at[0] in calls_held
            if s.out and s.id in self.rows[j]:  # its row kept, idle: it has left the batch
                self._close(s)


def _plain(fits: dict[int, str]) -> dict[int, str]:
    """The fits that are not a prompt chunk (the reading of last resort)."""
    return {s: how for s, how in fits.items() if how != "chunk"}


def follow_rows(calls: list[CallRecord], prompts: list[list[int]], eos: frozenset[int], emits: list[Emit]) -> None:
    """Name each target call's rows by the declared prompt its sequence starts with, else by the one
    declared sequence (prompt and emitted tokens) its followed tokens agree with (else unreadable)."""
    follower = Follower(calls, eos, [])
    follower.run()
    unused: dict[tuple[int, ...], list[int]] = {}  # declared prompt -> its indices not taken yet
    for i, prompt in enumerate(prompts):
        unused.setdefault(tuple(prompt), []).append(i)
    # Followed sequence -> the first declared index of its prompt left.
    taken = {f: unused[tuple(p)].pop(0) for f, p in enumerate(follower.prompts) if unused.get(tuple(p))}
    # A prompt whose end was read elsewhere (a trained model's choice can be the prompt's next token):
    # the declared sequence its tokens agree with, where exactly one does.
    declared = [list(p) for p in prompts]
    for e in emits:
        declared[e.seq_id] += e.tokens
    left = sorted(i for indices in unused.values() for i in indices)
    for f in sorted(set(range(len(follower.seqs))) - taken.keys()):  # those whose prompt is no declared one left
        context = follower.seqs[f].context
        agree = [i for i in left if declared[i][: len(context)] == context[: len(declared[i])]]
        if len(agree) == 1:
            taken[f] = agree[0]
            left.remove(agree[0])
    for j in follower.targets[len(follower.rows) :]:  # the calls from the one where reading stopped on
        calls[j].rows = None
        calls[j].mark_unreadable(follower.unfollowed[0])
    for j, held in follower.rows.items():
        if any(s >= 0 for s in set(held) - taken.keys()):
            calls[j].mark_unreadable(f"a row of target call {j} starts with no declared prompt")
        else:
            calls[j].rows = tuple(taken.get(s, s) for s in held)  # (an idle row's marker kept)
