"""Following sequences through an unmodified engine's target calls (`specviz watch --`): which
sequence each row of each target call holds, and what each sequence gained at each step.

An engine that serves reorders its rows, drops finished ones (the batch shrinks) and takes in
joining sequences (a re-prefill of the batch, or a prefill of the newcomer). A row is matched to a
sequence by its attended context, the sequence's prompt plus the tokens committed so far:
- a row that attends no cache slot shows its whole context (a prefill, a re-prefill, a cacheless or
  recompute loop): it holds the sequence whose context it equals (re-fed, not grown) or extends (the
  extension is what the sequence gained); a row that fits no sequence is a new one, its context the
  prompt, as every row of the first target call is;
- a row that attends a cache shows only its query, so it is matched by the chain: its pending token
  must be one the sequence's last step could have committed last (the target's argmax after the
  drafts it accepted, or a draft when no bonus is kept), and its context must have grown by what
  that step could accept (1 .. d + 1 slots); when its first draft call re-read its whole context
  (a draft without a cache), that context must extend the sequence's. Rows left unmatched are
  matched by pending token alone to the sequences left (an engine that moved a row's tokens but
  not its cache is read as the sequence it fed, and the wrong context flagged at that row);
- a newcomer's first call was a step when every newcomer of that call is fed its argmax next (or
  verified drafts), else a prefill of all but the last prompt token, which the next call feeds;
- rows keep their order when every row fits the sequence its row held in the previous target call
  of the same batch size. Otherwise the assignment must be unique up to sequences identical so far
  (same prompt, same tokens, same step read), which any assignment checks alike. Several that
  differ are never guessed between: reading stops at that call (noted; the trace is incomplete and
  the report names the skipped check), as it does when no assignment fits a batch that changed. A
  batch with a cache, of unchanged size, that no assignment fits keeps its order (the rule before
  rows were followed: a bug that breaks the chain is still read, and flagged, at its own row);
- a sequence that a call leaves out while holding others of its last call has left the batch: its
  last step gained what a greedy engine keeps (the drafts agreeing with the argmax, then the argmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

from specviz.watch.calls import (
    CallReader,
    RowQuery,
    argmax_at,
    attended_ids,
    attends_cache,
    context_before,
    draft_free_query,
    first_slot_query,
    last_slot,
    query_flags,
)
from specviz.watch.hooks import CallRecord
from specviz.watch.steps import Emit, matched_prefix, row_tokens

MATCHINGS = 256  # assignments of one call enumerated at most; more is read as ambiguous
NEW = -1  # the row starts a new sequence
IDLE = -2  # the row holds a finished sequence fed again: no step for anyone


class Ambiguous(str):
    """Why a call's rows are not followed: several assignments fit them."""


@dataclass(frozen=True)
class RowView:
    """One row of one target call, read as a given sequence."""

    rq: RowQuery
    token: int  # the pending token
    context: int  # slots the pending token attends before itself (-1: a mask the hooks could not read)
    query: list[int]  # the row's attended query tokens up to the pending one
    whole: bool  # the row attends no cache slot: `query` is its whole context


@dataclass
class Seq:
    """One sequence as followed so far."""

    id: int
    context: list[int]  # prompt + committed tokens, as read
    prompt_len: int
    origin: tuple[int, int]  # (target call, row) where it first appeared
    at: tuple[int, int]  # (target call, row) that last held it
    step: tuple[int, int] | None = None  # (call, row) of its step whose gain is not read yet
    opened: bool = True  # not yet known whether its first call was a step
    refed: bool = False  # re-fed unchanged since `step`: read as finished if it never grows again
    finished: bool = False


class Follower:
    """Walks the target calls in order; `prompts`, `emits` and each call's rows once `run` returns."""

    def __init__(self, calls: list[CallRecord], eos: frozenset[int], notes: list[str]) -> None:
        self.calls, self.eos, self.notes = calls, eos, notes
        self.read = CallReader(calls)
        # No draft model (prompt lookup, n-gram or extra-head drafting): drafts are read from what
        # follows the committed tokens (`calls.draft_free_query`), not from draft calls.
        self.draft_free = not any(c.role == "draft" and not c.drafter for c in calls)
        self.seqs: list[Seq] = []
        self.emits: list[Emit] = []
        self.rows: dict[int, tuple[int, ...]] = {}  # target call -> sequence per row (< 0: none)
        self.was_step: dict[int, bool] = {}  # opening call -> it was a step for its newcomers
        self.unfollowed: list[str] = []  # why reading stopped, for the report's skipped checks
        self.prev: int | None = None
        self._greedy_ends: list[tuple[Seq, Emit]] = []  # last steps read as greedy, no EOS
        self._stopped: list[Seq] = []  # finished by being fed again without growing
        self._views: dict[tuple[int, int, int], RowView] = {}

    @property
    def prompts(self) -> list[list[int]]:
        # A row with no token in the first call that nothing continued: a placeholder prompt.
        return [s.context[: s.prompt_len] or [0] for s in self.seqs]

    def run(self) -> None:
        targets = [i for i, c in enumerate(self.calls) if c.role == "target"]
        for n, j in enumerate(targets):
            why = self._call(j)
            if why is not None:
                self._stop(j, len(targets) - n, why)
                break
        for s in self.seqs:
            if not s.finished:
                self._close(s)
        self._cut_to_budget()
        self.emits.sort(key=lambda e: (e.after, e.seq_id))

    # ------------------------------------------------------------------ one call

    def _call(self, j: int) -> str | None:
        """Assign call j's rows to sequences and read what the previous steps gained; else why not."""
        call = self.calls[j]
        active = [r for r in range(call.batch_size) if any(query_flags(call, r))]
        if self.prev is None:  # every row is new, even one with no token yet (a one-token prompt's prefill)
            assigned: dict[int, tuple[int, str]] | str = {r: (NEW, "new") for r in range(call.batch_size)}
        else:
            assigned = self._assign(j, active)
        if isinstance(assigned, str):
            return assigned
        before = {s.id: s.at[0] for s in self.seqs}
        self._apply(j, assigned)
        self._leave(j, assigned, before)
        self.rows[j] = tuple(self._row_id(j, r, assigned) for r in range(call.batch_size))
        call.rows = self.rows[j]  # later reads search draft calls back to each sequence's own calls
        self.prev = j
        return None

    def _row_id(self, j: int, r: int, assigned: dict[int, tuple[int, str]]) -> int:
        seq = assigned.get(r, (IDLE, ""))[0]
        if seq >= 0:
            return seq
        held = self.rows.get(self.prev, ()) if self.prev is not None else ()
        kept = held[r] if r < len(held) and self.calls[self.prev].batch_size == self.calls[j].batch_size else -1
        # An idle row keeps its finished sequence, so its reads stop at that sequence's calls.
        return kept if kept >= 0 and self.seqs[kept].finished else -1 - r

    def _assign(self, j: int, active: list[int]) -> dict[int, tuple[int, str]] | str:
        """Row -> (sequence or NEW or IDLE, how it fits) for the call's active rows, or why none."""
        same = self.calls[j].batch_size == self.calls[self.prev].batch_size
        if same:
            kept = self._kept(j, active)
            if kept is not None:
                return kept
        found = self._unique(j, active, {r: self._fits(j, r) for r in active})
        if isinstance(found, Ambiguous):
            return found  # several assignments fit: never guessed, reading stops
        if not same or isinstance(found, dict) and self._fresh(j, found):
            return found
        if isinstance(found, str) or any(s == NEW and not self._joins(j, r) for r, (s, _) in found.items()):
            return self._legacy(active)
        return found

    def _fresh(self, j: int, found: dict[int, tuple[int, str]]) -> bool:
        """A call without a cache whose every row is a new sequence: a second decode of fresh prompts.
        (Some rows new and some not, in a batch of unchanged size, is rather a context the engine
        fed wrong, such as a mask that attends padding: that batch keeps its order.)"""
        return self.calls[j].cache_width == 0 and all(s == NEW for s, _ in found.values())

    def _joins(self, j: int, r: int) -> bool:
        """A row that attends no slot of the call's cache: a newcomer prefilled among decoding rows."""
        return self.calls[j].cache_width > 0 and self._view(j, r, NEW).whole

    def _fits(self, j: int, r: int) -> dict[int, str]:
        """Live sequence -> how row r of call j continues it ("grow", "same", "again", "open")."""
        out = {}
        for s in self.seqs:
            if not s.finished:
                how = self._fit(s, self._view(j, r, s.id))
                if how is not None:
                    out[s.id] = how
        return out

    def _kept(self, j: int, active: list[int]) -> dict[int, tuple[int, str]] | None:
        """Every active row continues the sequence its row held before: rows kept their order."""
        held = self.rows[self.prev]
        out: dict[int, tuple[int, str]] = {}
        for r in active:
            seq = held[r]
            if seq >= 0 and self.seqs[seq].finished:
                if self._joins(j, r):
                    return None  # a newcomer prefilled in a finished row's place
                out[r] = (IDLE, "idle")
                continue
            how = self._fit(self.seqs[seq], self._view(j, r, seq)) if seq >= 0 else None
            if how is None:
                return None
            out[r] = (seq, how)
        # A finished row's place may hold a live sequence moved there: then the rows did move.
        placed = {seq for seq, _ in out.values()}
        moved = [s for s in self.seqs if not s.finished and s.id not in placed]
        idle = [r for r, (seq, _) in out.items() if seq == IDLE]
        if any(self._fit(s, self._view(j, r, s.id)) for r in idle for s in moved):
            return None
        return out

    def _legacy(self, active: list[int]) -> dict[int, tuple[int, str]]:
        """Rows keep their order, whatever they were fed: a batch of unchanged size that no
        assignment explains (an engine bug that breaks the chain is then read, and flagged, at its row)."""
        held = self.rows[self.prev]
        out = {}
        for r in active:
            seq = held[r]
            if seq < 0 or self.seqs[seq].finished:
                out[r] = (IDLE, "idle")
            else:
                out[r] = (seq, "open" if self.seqs[seq].opened else "grow")
        return out

    # ------------------------------------------------------------------ reading a row

    def _view(self, j: int, r: int, seq: int) -> RowView:
        key = (j, r, seq)
        if key not in self._views:
            call = self.calls[j]
            rq = self.read(j, r, seq if seq >= 0 else len(self.seqs) + r)
            if self.draft_free and attends_cache(call, r):  # its first real slot is the pending token
                rq = first_slot_query(call, r) or rq
            self._views[key] = RowView(
                rq=rq,
                token=call.input_ids[r][rq.pending],
                context=context_before(call, r, rq.pending),
                query=attended_ids(call, r, rq.pending),
                whole=not attends_cache(call, r),
            )
        return self._views[key]

    def _fit(self, s: Seq, v: RowView) -> str | None:
        """How the row continues `s` (None: it cannot hold `s`); see the module docstring."""
        if v.whole:
            n = len(s.context)
            if v.query == s.context:
                return "same"
            if len(v.query) > n and v.query[:n] == s.context:
                return "open" if s.opened else "grow"
            return None
        if not self._draft_reads(s, v):
            return None
        if s.opened:
            m, o = len(s.context), s.origin
            return "open" if v.context < 0 or m <= v.context <= m + self.read(*o, s.id).drafts else None
        assert s.step is not None
        drafts, targets, pending = self._step_tokens(s)
        if v.context < 0:  # no mask to count: the greedy continuation only
            return "grow" if targets and v.token == targets[matched_prefix(drafts, targets) or 0] else None
        grown = v.context + 1 - len(s.context)
        if 1 <= grown <= len(drafts) + 1:
            took = grown - 1
            if not targets or v.token == targets[took] or (took < len(drafts) and v.token == drafts[took]):
                return "grow"
        # A finished row fed its last token again (with or without its cache growing).
        return "again" if 0 <= grown <= 1 and v.token == pending else None

    def _draft_reads(self, s: Seq, v: RowView) -> bool:
        """A draft that keeps no cache re-reads the row's whole context at its first proposal: when
        it did, that context must extend the sequence's (else the row cannot be the sequence)."""
        if not v.rq.chain:
            return True
        call, row = v.rq.chain[0]
        if attends_cache(self.calls[call], row):
            return True
        fed, n = attended_ids(self.calls[call], row), len(s.context)
        return len(fed) >= n and fed[:n] == s.context

    def _step_tokens(self, s: Seq) -> tuple[list[int], list[int], int]:
        """(drafts, target argmax, pending token) of the sequence's open step."""
        i, ri = s.step
        rq = self.read(i, ri, s.id)
        if self.draft_free and not rq.drafts:  # the drafts are what follows the committed tokens
            rq = draft_free_query(self.calls[i], ri, s.context) or rq
        drafts, targets = row_tokens(self.calls[i], ri, rq)
        return drafts, targets, self.calls[i].input_ids[ri][rq.pending]

    # ------------------------------------------------------------------ unique assignments

    def _unique(self, j: int, active: list[int], fits: dict[int, dict[int, str]]) -> dict[int, tuple[int, str]] | str:
        """The one assignment of rows to sequences the fits allow, up to identical sequences; else why not.

        Rows the chain (token and context length) matches to no sequence are then matched by token
        alone to the sequences left: an engine that moves a row's tokens but not its cache or mask
        (a bug) still has that row read as the sequence it fed, and the wrong context flagged there."""
        out = self._one_assignment(j, active, fits, {s.id for s in self.seqs if not s.finished})
        if isinstance(out, str):
            return out
        for r in active:  # a finished row fed again (idle) is a better reading than a token alone
            if r not in out and not self._view(j, r, NEW).whole and self._again(j, r):
                out[r] = (IDLE, "idle")
        left = {s.id for s in self.seqs if not s.finished} - {s for s, _ in out.values()}
        cached = [r for r in active if r not in out and not self._view(j, r, NEW).whole]
        if cached and left:
            weak = {r: {s: "weak" for s in left if self._weak(self.seqs[s], self._view(j, r, s))} for r in cached}
            more = self._one_assignment(j, cached, weak, left)
            if isinstance(more, str):
                return more
            out.update(more)
        for r in active:
            if r in out:
                continue
            if self._view(j, r, NEW).whole:
                out[r] = (NEW, "new")
            else:
                return f"row {r} of target call {j} continues no sequence read so far"
        return out

    def _one_assignment(
        self, j: int, rows: list[int], fits: dict[int, dict[int, str]], allowed: set[int]
    ) -> dict[int, tuple[int, str]] | str:
        """Rows -> sequences of `allowed`, the one way the fits allow up to identical sequences; rows
        no sequence fits are left out. Several ways: why not."""
        classes = self._classes(allowed)
        of = {s: k for k, members in enumerate(classes) for s in members}
        options = {r: sorted({of[s] for s in fits[r] if s in of}) for r in rows}
        found = _matchings([r for r in rows if options[r]], options, [len(m) for m in classes])
        if len(found) > 1:
            differ = sorted({r for m in found for r in m if m[r] != found[0].get(r)})
            why = f"rows {differ} of target call {j} fit more than one sequence each, and those differ so far"
            return Ambiguous(why)
        chosen = found[0] if found else {}
        out: dict[int, tuple[int, str]] = {}
        for k, members in enumerate(classes):
            # Identical so far: any order checks alike; the order they held is kept.
            free = sorted((self.seqs[s] for s in members), key=lambda s: s.at)
            for r in sorted(r for r, c in chosen.items() if c == k):
                s = next((m for m in free if m.id in fits[r]), None)
                if s is None:  # alike so far, yet not read alike here: not guessed
                    return Ambiguous(f"row {r} of target call {j} fits sequences alike so far, not alike here")
                free.remove(s)
                out[r] = (s.id, fits[r][s.id])
        return out

    def _weak(self, s: Seq, v: RowView) -> bool:
        """The row's pending token is one the sequence's open step could have committed last."""
        if s.opened or v.whole or s.step is None:
            return False
        drafts, targets, _ = self._step_tokens(s)
        return v.token in targets or v.token in drafts

    def _classes(self, allowed: set[int]) -> list[list[int]]:
        """Sequences grouped by everything the checks read of them: identical so far."""
        live = [self.seqs[s] for s in sorted(allowed)]
        keyed = sorted(((self._likeness(s), s.id) for s in live), key=lambda x: (repr(x[0]), x[1]))
        return [[s for _, s in group] for _, group in groupby(keyed, key=lambda x: repr(x[0]))]

    def _likeness(self, s: Seq) -> tuple[Any, ...]:
        step = None
        if s.step is not None:
            drafts, targets, pending = self._step_tokens(s)
            step = (tuple(drafts), tuple(targets), pending)
        return (tuple(s.context), s.prompt_len, s.opened, s.refed, step, s.origin[0] if s.opened else None)

    def _again(self, j: int, r: int) -> bool:
        """The row is a finished sequence fed its last token again (its cache may have kept growing)."""
        for s in self.seqs:
            v = self._view(j, r, s.id) if s.finished and s.context else None
            if v is not None and v.token == s.context[-1] and (v.context < 0 or v.context >= len(s.context) - 1):
                return True
        return False

    # ------------------------------------------------------------------ applying

    def _apply(self, j: int, assigned: dict[int, tuple[int, str]]) -> None:
        opening = [(self.seqs[s], r) for r, (s, how) in sorted(assigned.items()) if how == "open"]
        for o in sorted({s.origin[0] for s, _ in opening} - set(self.was_step)):
            members = [(s, self._view(j, r, s.id)) for s, r in opening if s.origin[0] == o]
            self.was_step[o] = self._opened_by_step(o, members)
        for r, (seq, how) in sorted(assigned.items()):
            if seq == NEW:
                assigned[r] = (self._new(j, r), how)
            elif seq >= 0:
                self._continue(self.seqs[seq], j, r, how)

    def _new(self, j: int, r: int) -> int:
        seq = len(self.seqs)
        query = self._view(j, r, NEW).query if any(query_flags(self.calls[j], r)) else []
        self.seqs.append(Seq(seq, list(query), len(query), origin=(j, r), at=(j, r), step=(j, r)))
        return seq

    def _continue(self, s: Seq, j: int, r: int, how: str) -> None:
        v = self._view(j, r, s.id)
        s.at = (j, r)
        if how == "same":
            s.refed = s.step is not None and not s.opened
            return
        if how == "again":
            s.finished = True  # fed again without growing: the engine keeps computing a finished row
            self._stopped.append(s)
            return
        if s.opened:
            s.opened = False
            if not self.was_step[s.origin[0]] or not s.context:
                # Its first call was a prefill of all but the last prompt token: this call feeds it.
                s.context.append(v.token)
                s.prompt_len += 1
                s.step = (j, r)
                return
        self._commit(s, self._by_token(s, v) if how == "weak" else self._gained(s, v))
        s.step, s.refed = (j, r), False

    def _opened_by_step(self, o: int, members: list[tuple[Seq, RowView]]) -> bool:
        """Was call o a step for its newcomers: it verified drafts, or the next call feeds its argmax?"""
        call = self.calls[o]
        if call.argmax is None:
            return True
        for s, v in sorted(members, key=lambda m: m[0].origin):
            row = s.origin[1]
            if self.read(o, row, s.id).drafts:
                return True
            if argmax_at(call, row, last_slot(call, row)) != v.token:
                return False
        return True

    def _gained(self, s: Seq, v: RowView | None) -> list[int]:
        """Tokens the sequence's open step committed, read from its next row `v` (None: its last step)."""
        drafts, targets, _ = self._step_tokens(s)
        agreed = matched_prefix(drafts, targets) if targets else 0
        if v is None or self.draft_free and v.whole:
            # Its last step, or a row re-fed with its own drafts, which only the greedy rule tells
            # apart (no draft model): what a greedy engine keeps.
            return drafts[:agreed] + ([targets[agreed]] if targets else [])
        reread = self._reread(s, v)
        if reread is not None:
            return reread
        grown = v.context + 1 - len(s.context)
        if grown == 0:
            return []
        if 1 <= grown <= len(v.query):
            return v.query[len(v.query) - grown :]  # re-fed tokens (a recompute loop) show themselves
        accepted = grown - 1 if 1 <= grown <= len(drafts) + 1 else (agreed or 0)
        if targets and accepted > (agreed or 0) and v.token == targets[agreed or 0]:
            # Fed the greedy continuation, yet the context grew past what greedy acceptance
            # allows: the tokens say what was committed (the command reads greedy engines), the
            # KV check judges the context (a rejected slot left attended, another row's slot).
            accepted = agreed or 0
        return drafts[:accepted] + [v.token]

    def _reread(self, s: Seq, v: RowView) -> list[int] | None:
        """The tokens gained, as the row's first draft call re-read them: a draft without a cache
        is fed the whole sequence up to the pending token, which says what was committed whatever
        the target's context (a stale, lost or foreign slot) counts."""
        if v.whole or not v.rq.chain:
            return None  # a row that re-feeds its context shows its tokens itself
        call, row = v.rq.chain[0]
        if attends_cache(self.calls[call], row):
            return None
        fed, n = attended_ids(self.calls[call], row), len(s.context)
        if len(fed) > n and fed[:n] == s.context and fed[-1] == v.token:
            return fed[n:]
        return None

    def _by_token(self, s: Seq, v: RowView) -> list[int]:
        """Tokens of a step whose next row's context cannot be trusted: the drafts before the slot
        whose argmax the row is fed (the greedy one if it is), then that token."""
        drafts, targets, _ = self._step_tokens(s)
        agreed = matched_prefix(drafts, targets) if targets else 0
        if targets and targets[agreed or 0] == v.token:
            took = agreed or 0
        elif v.token in targets:
            took = targets.index(v.token)
        else:
            took = drafts.index(v.token)  # no bonus kept: the last draft taken is fed
        return drafts[:took] + [v.token]

    def _commit(self, s: Seq, tokens: list[int]) -> Emit | None:
        """The open step's tokens, up to the first EOS; none, or an EOS, finishes the sequence."""
        i = s.step[0]
        cut = next((n + 1 for n, t in enumerate(tokens) if t in self.eos), None)
        tokens = tokens[:cut] if cut else tokens
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
        if s.step is not None and not s.opened:
            emit = self._commit(s, [] if s.refed else self._gained(s, None))
            if s.refed:
                self._stopped.append(s)
            elif emit is not None and emit.finish_reason is None:
                self._greedy_ends.append((s, emit))
        s.finished = True

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
        greedy = [(s, e, self._output(s) - len(e.tokens)) for s, e in self._greedy_ends]
        stopped = {self._output(s) for s in self._stopped}
        ranges = [(b + 1, b + len(e.tokens)) for _, e, b in greedy]
        budget = shared_budget(ranges, stopped)
        if budget is None:
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
            ends = [e for e in self.emits if e.seq_id == s.id]
            if ends and not self._ended_by_eos(s):
                ends[-1].finish_reason = "length"

    def _output(self, s: Seq) -> int:
        return len(s.context) - s.prompt_len

    def _ended_by_eos(self, s: Seq) -> bool:
        return any(e.seq_id == s.id and e.finish_reason == "eos" for e in self.emits)

    def _cuttable(self, s: Seq, budget: int, pinned: bool) -> bool:
        """Past `budget` lies only the sequence's greedy end, or (when a sequence ended exactly at
        the budget, `pinned`) repeats of its token at the budget, then its greedy end. A sequence
        that repeats one token while it decodes is not cut on a budget only bounded from above."""
        end = next((e for g, e in self._greedy_ends if g is s), None)
        read = s.context[s.prompt_len : len(s.context) - (len(end.tokens) if end else 0)]
        if len(read) < budget or len(read) == budget and end is not None and self._fed_along(end, budget):
            return True
        return pinned and 0 < budget < len(read) and all(t == read[budget - 1] for t in read[budget:])

    def _fed_along(self, end: Emit, budget: int) -> bool:
        """The call of this greedy end also made the last step of a sequence below the budget: a
        finished row fed along with the rows still decoding (a loop that re-feeds every row)."""
        return any(e.after == end.after and self._output(g) - len(e.tokens) < budget for g, e in self._greedy_ends)

    def _trim(self, s: Seq, extra: int) -> None:
        """Drop the sequence's last `extra` tokens, from its last emits."""
        del s.context[-extra:]
        for emit in reversed([e for e in self.emits if e.seq_id == s.id]):
            cut = min(extra, len(emit.tokens))
            del emit.tokens[len(emit.tokens) - cut :]
            extra -= cut
            if not emit.tokens:
                self.emits.remove(emit)
            if not extra:
                return

    def _leave(self, j: int, assigned: dict[int, tuple[int, str]], before: dict[int, int]) -> None:
        """Sequences this call leaves out while holding others of their last call have left the batch."""
        held = {seq for seq, _ in assigned.values() if seq >= 0}
        calls_held = {before[seq] for seq in held if seq in before}
        for s in self.seqs:
            if s.id not in held and s.id in before and not s.finished and before[s.id] in calls_held:
                self._close(s)

    def _stop(self, j: int, unread: int, why: str) -> None:
        message = f"{why}: {unread} target calls from call {j} on are not read (declare rows with w.rows)"
        self.notes.append(message)
        self.unfollowed.append(message)


def _matchings(rows: list[int], options: dict[int, list[int]], capacity: list[int]) -> list[dict[int, int]]:
    """Distinct assignments row -> class (each class holding at most its capacity) that assign the
    most rows; a row whose classes are all full stays unassigned. Stops at MATCHINGS found."""
    found: list[dict[int, int]] = []
    left = list(capacity)
    current: dict[int, int] = {}

    def walk(k: int) -> None:
        if len(found) >= MATCHINGS:
            return
        if k == len(rows):
            found.append(dict(current))
            return
        free = [c for c in options[rows[k]] if left[c] > 0]
        if not free:
            walk(k + 1)
            return
        for c in free:
            current[rows[k]], left[c] = c, left[c] - 1
            walk(k + 1)
            del current[rows[k]]
            left[c] += 1

    walk(0)
    most = max((len(m) for m in found), default=0)
    return [m for m in found if len(m) == most]


def shared_budget(ranges: list[tuple[int, int]], lengths: set[int]) -> int | None:
    """The one output length every ending by length stopped at: equal to every length in `lengths`,
    else the smallest range end; and within every (low, high) range that starts at or below it (a
    range above it was read past it). None when there is none."""
    if len(lengths) > 1 or not (lengths or ranges):
        return None
    budget = next(iter(lengths)) if lengths else min(hi for _, hi in ranges)
    return budget if all(budget <= hi for lo, hi in ranges if lo <= budget) else None


def follow_rows(calls: list[CallRecord], prompts: list[list[int]], eos: frozenset[int]) -> None:
    """The inferred producer for an API run that declared no rows while its batch changed (a packed
    engine's sequences leave the row): each target call's rows are followed as the command follows
    them, and named by the declared prompt each followed sequence starts with. A call the reading
    did not reach, or a row whose prompt is none of the declared ones, is unreadable."""
    follower = Follower(calls, eos, [])
    follower.run()
    taken: dict[int, int] = {}
    for f, prompt in enumerate(follower.prompts):
        p = next((i for i, q in enumerate(prompts) if q == prompt and i not in taken.values()), None)
        if p is not None:
            taken[f] = p
    why = follower.unfollowed[0] if follower.unfollowed else "rows not followed"
    for j, call in enumerate(calls):
        if call.role != "target":
            continue
        held = follower.rows.get(j)
        if held is None:
            call.rows, call.unreadable = None, call.unreadable or why
        elif any(s >= 0 and s not in taken for s in held):
            call.unreadable = call.unreadable or f"a row of target call {j} starts with no declared prompt"
        else:
            call.rows = tuple(taken[s] if s >= 0 else s for s in held)
