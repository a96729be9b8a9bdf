"""What `follow.Follower` keeps (`RowView`, `Seq`, `Step`) and its assignments: which sequence each row
of a call holds, the one way the fits allow up to sequences identical so far (`Ambiguous`: several),
and the ties the call's own evidence breaks (docs/watch-command.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specviz.watch.calls import RowQuery, argmax_at, matched_prefix
from specviz.watch.view import Padded

NEW = -1  # the row starts a new sequence
IDLE = -2  # the row holds a finished sequence fed again: no step for anyone


@dataclass(frozen=True)
class RowView:
    """One row of one target call, read as a given sequence."""

    rq: RowQuery
    token: int  # the pending token
    context: int  # slots the pending token attends before itself (-1: a mask the hooks could not read)
    query: list[int]  # the row's attended query tokens up to the pending one
    whole: bool  # the row attends no cache slot: `query` is its whole context
    position: int  # the position fed to the pending token (-1: the engine fed none)

    def refeeds(self, context: list[int]) -> bool:
        """The query tokens fed before the pending one are the sequence's at those slots."""
        before = self.query[:-1]
        start = self.context - len(before)
        return start >= 0 and before[: max(len(context) - start, 0)] == context[start:]


@dataclass
class Seq:
    """One sequence as followed so far."""

    id: int
    context: list[int]  # prompt + committed tokens, as read
    prompt_len: int
    origin: tuple[int, int]  # (target call, row) where it first appeared
    at: tuple[int, int]  # (target call, row) that last held it
    step: tuple[int, int]  # (call, row) of its step whose gain is not read yet (its first call, until one)
    opened: bool = True  # not yet known whether its first call was a step
    in_prompt: bool = False  # its open step follows a prefill: a prompt chunk, or a step (the next call tells)
    chunk_end: bool = False  # its prompt's end read from a choice the next call fed: a chunk's alike (`_step`)
    refed: bool = False  # re-fed unchanged since `step`: read as finished if it never grows again
    finished: bool = False
    out: bool = False  # left out of a call that held others of its last call: gone, or sat out (`_unique`)
    base: tuple[int, int] = (0, 0)  # over another request's KV: the stale slots and position its rows start at

    @property
    def growth(self) -> str:
        """How a row that extends its context continues it: its first call's reading is still open."""
        return "open" if self.opened else "grow"


@dataclass(frozen=True)
class Step:
    """A sequence's open step as its row was fed (a tree row: along its greedy path)."""

    drafts: list[int]
    targets: list[int]  # the target's argmax at the pending token and each draft; [] where not kept
    pending: int
    most: int  # the most tokens it could commit: its drafts (a tree's deepest path) + 1

    @property
    def agreed(self) -> int:
        """Drafts a greedy engine keeps: those that agree with the argmax (none without one)."""
        return matched_prefix(self.drafts, self.targets) or 0

    @property
    def choice(self) -> int | None:
        """The target's choice after the agreed drafts (None: no argmax kept)."""
        return self.targets[self.agreed] if self.targets else None

    @property
    def greedy(self) -> list[int]:
        """What a greedy engine commits: the agreed drafts, then the target's choice (if kept)."""
        return self.drafts[: self.agreed] + self.targets[self.agreed : self.agreed + 1]

    def could_end(self, took: int, token: int) -> bool:
        """Could a step that took `took` drafts commit `token` last (the target's choice, or that draft)?"""
        return 0 <= took <= len(self.drafts) and (
            not self.targets or token == self.targets[took] or self.drafts[took : took + 1] == [token]
        )


MATCHINGS = 256  # assignments of one call enumerated at most; more is read as ambiguous


class Unfollowed(Exception):
    """No assignment fits a call's rows (a batch of unchanged size then keeps its order, `Follower._legacy`)."""


class Ambiguous(Unfollowed):
    """Several assignments fit the call's rows: never guessed, reading stops."""


class Sampled(Ambiguous):
    """The engine does not feed the model's choice (it samples): the command reads greedy engines only."""


class Assignments:
    """Mixed into `Follower` (its calls, sequences and row views)."""

    def _unique(self, j: int, active: list[int]) -> dict[int, tuple[int, str]]:
        """The one assignment of rows to sequences (`Unfollowed`: none); unfit rows by token alone after."""
        live = {s.id for s in self._live}
        out = self._one_assignment(j, active, {r: self._fits(j, r) for r in active}, live)
        # Rows no present sequence holds, by their chain to the sequences a call left out (`Seq.out`).
        away = [s for s in self.seqs if s.out]  # (never finished: `_close` and every reading clear `out`)
        rows = _rest(active, out)
        out.update(self._one_assignment(j, rows, {r: self._chain_fits(j, r, away) for r in rows}, {s.id for s in away}))
        # A finished row fed again (idle) is a better reading than a token alone.
        out |= {r: (IDLE, "idle") for r in _rest(active, out) if self._again(j, r)}
        left = live - {s for s, _ in out.values()}
        cached = [r for r in _rest(active, out) if not self._starts(j, r)]
        weak = {r: {s: "weak" for s in left if self._weak(self.seqs[s], self._view(j, r, s))} for r in cached}
        out.update(self._one_assignment(j, cached, weak, left))
        if stray := _rest(cached, out):
            raise Unfollowed(f"row {stray[0]} of target call {j} continues no sequence read so far")
        return out | {r: (NEW, "new") for r in _rest(active, out)}  # the rest start sequences

    def _starts(self, j: int, r: int) -> bool:
        """A row that starts a sequence: it shows its whole context, or a cached newcomer (over stale KV)."""
        v = self._view(j, r, NEW)
        return v.whole or not v.rq.drafts and len(v.query) > 1 or self._opens(j, r)

    def _opens(self, j: int, r: int) -> bool:
        """A cached row fed no drafts whose query and the target's choice a cacheless draft row after
        call j re-reads from the start, continuing no live sequence."""
        feeds = self.cacheless[j]
        if not feeds:  # (no draft row to re-read it: the row's reading as a newcomer is not needed)
            return False
        v, call = self._view(j, r, NEW), self.calls[j]
        opened = [*v.query, argmax_at(call, r, call.last_slots[r])]  # (no argmax: None, fed by no row)
        reread = (fed for fed in feeds if fed[: len(opened)] == opened)  # (an idle row's [0] is shorter)
        live = [s.context for s in self._live]
        return not v.whole and not v.rq.drafts and any(all(fed[: len(c)] != c for c in live) for fed in reread)

    def _base(self, j: int, r: int) -> tuple[int, int]:
        """A new cached row: the slots its first token attends before itself and its position (`Seq.base`)."""
        call = self.calls[j]
        if not call.views[r].attends_cache():
            return (0, 0)
        first = call.views[r].flags.index(1)
        context = call.views[r].before(first)
        return (max(context, 0), int(call.positions[r][first]) if call.positions_fed else 0)

    def _one_assignment(
        self, j: int, rows: list[int], fits: dict[int, dict[int, str]], allowed: set[int]
    ) -> dict[int, tuple[int, str]]:
        """Rows -> sequences of `allowed` (`_told_apart`), the one way up to identical ones (`Ambiguous`: several)."""
        fits = self._told_apart(j, fits)
        classes = self._classes(allowed)
        of = {s: k for k, members in enumerate(classes) for s in members}
        options = {r: sorted({of[s] for s in fits[r]}) for r in rows}  # (fits name only `allowed` sequences)
        found = _matchings(rows, options, [len(m) for m in classes])  # (a row with no option stays out)
        if len(found) > 1:
            # Every row read another way by some matching: another sequence, or none (left out).
            differ = sorted({r for m in found for r in {*m, *found[0]} if m.get(r) != found[0].get(r)})
            why = f"rows {differ} of target call {j} fit more than one sequence each, or one sequence"
            why += " between them, and those differ so far"
            raise Ambiguous(why)
        # Identical so far: any order checks alike; the order they held is kept.
        free = [sorted((self.seqs[s] for s in members), key=lambda s: s.at) for members in classes]
        out: dict[int, tuple[int, str]] = {}
        for r, k in sorted(found[0].items(), key=lambda rk: rk[::-1]):  # class by class, row by row
            s = next((m for m in free[k] if m.id in fits[r]), None)
            if s is None:  # alike so far, yet not read alike here: not guessed
                raise Ambiguous(f"row {r} of target call {j} fits sequences alike so far, not alike here")
            free[k].remove(s)
            out[r] = (s.id, fits[r][s.id])
        return out

    def _told_apart(self, j: int, fits: dict[int, dict[int, str]]) -> dict[int, dict[int, str]]:
        """The fits less the tie pairs the call's evidence (`EVIDENCE`) rules out while a rival agrees."""
        pairs = [(r, s, how) for r, f in fits.items() for s, how in f.items()]
        # The other pairs of each pair's tie: its row with another sequence, another row with its sequence.
        rivals = {(r, s): [(q, t) for q, t, _ in pairs if (q == r) != (t == s)] for r, s, _ in pairs}
        # Evidence that an uncontested row contradicts (its own sequence at a rebuilt or shifted
        # layout, or a systematic convention) is not read this call: every tie stands instead.
        plain = [(r, s, how) for r, s, how in pairs if not rivals[r, s]]
        trusted = [c for c in CHECKS if all(self._says(c, j, r, s, how) is not False for r, s, how in plain)]
        agrees = {(r, s): all(self._says(c, j, r, s, how) is not False for c in trusted) for r, s, how in pairs}
        out: dict[int, dict[int, str]] = {r: {} for r in fits}
        for r, s, how in pairs:
            # A chunk is the reading of last resort: one the evidence rules out goes (`_unique`: weak).
            if agrees[r, s] or how != "chunk" and not any(agrees[p] for p in rivals[r, s]):
                out[r][s] = how
        return out

    def _says(self, check: Callable[..., bool | None], j: int, r: int, s: int, how: str) -> bool | None:
        """What one kind of evidence says of row r holding sequence s (None: it reads nothing of `how`)."""
        if check not in EVIDENCE[how]:
            return None
        return check(self, j, r, self.seqs[s], self._view(j, r, s), how)

    def _position_agrees(self, j: int, r: int, s: Seq, v: RowView, how: str) -> bool | None:
        """The pending token sits at the sequence's length: a token its step could commit there."""
        if not self.calls[j].positions_fed:
            return None
        step = self._step_tokens(s)
        took = v.position - len(s.context)
        if how == "chunk":  # a chunk of the prompt is kept whole
            return took == len(step.drafts)
        return step.could_end(took, v.token)

    def _opening_agrees(self, j: int, r: int, s: Seq, v: RowView, how: str) -> bool | None:
        """A newcomer's row is fed the target's choice at its first call's last slot."""
        if v.whole or self.read(*s.origin, s.id).drafts:
            return None  # (verified drafts at its first call: the chain reads it)
        call, row = self.calls[s.origin[0]], s.origin[1]
        chose = argmax_at(call, row, call.last_slots[row])
        return None if chose is None else v.token == chose

    def _greedy_agrees(self, j: int, r: int, s: Seq, v: RowView, how: str) -> bool | None:
        """The context grew by the drafts a greedy step keeps plus one (None: no growth or argmax to read)."""
        step = self._step_tokens(s)
        if v.context < 0 or not step.targets:
            return None
        return v.context - len(s.context) == step.agreed

    def _history_agrees(self, j: int, r: int, s: Seq, v: RowView, how: str) -> bool | None:
        """A padded row's 2-D mask keeps its history: old cache slots alike, fed slots at most dropped."""
        call, (jp, rp) = self.calls[j], s.at
        before = self.calls[jp]
        old, new = _columns(before, rp), _columns(call, r)
        if old is None or new is None or call.cache_width < len(old):
            return None  # (or the cache was cropped or rebuilt: its history is not where it was)
        n = before.cache_width  # (a `Padded` view's columns are ints already)
        return new[:n] == old[:n] and all(a <= b for a, b in zip(new[n : len(old)], old[n:], strict=True))

    def _weak(self, s: Seq, v: RowView) -> bool:
        """The row's pending token is one the sequence's open step could have committed last."""
        if s.opened or v.whole:
            return False
        step = self._step_tokens(s)
        return v.token in [*step.targets, *step.drafts]

    def _classes(self, allowed: set[int]) -> list[list[int]]:
        """Sequences grouped by everything the checks read of them: identical so far."""
        classes: dict[tuple[Any, ...], list[int]] = {}  # (any order: only a unique matching is read)
        for s in sorted(allowed):
            classes.setdefault(self._likeness(self.seqs[s]), []).append(s)
        return list(classes.values())

    def _likeness(self, s: Seq) -> tuple[Any, ...]:
        # Its open step by what a greedy step gains from it: twins whose steps were fed other
        # drafts (a row with less budget left drafts fewer) and chose the same are alike.
        step = self._step_tokens(s)
        fed = (tuple(step.greedy if step.targets else step.drafts), step.pending)  # (no argmax: its drafts)
        return (tuple(s.context), s.prompt_len, s.opened, s.refed, fed, s.origin[0] if s.opened else None)


_HISTORY = (Assignments._history_agrees,)
# The evidence that reads each way a row fits a sequence (`_says`): a position and greedy growth
# only of a step's growth (a row read as grown, by its token, or as a chunk), a first choice only of an opening.
EVIDENCE: dict[str, tuple[Callable[..., bool | None], ...]] = {
    "grow": (Assignments._position_agrees, *_HISTORY, Assignments._greedy_agrees),
    "weak": (Assignments._position_agrees, *_HISTORY),
    "chunk": (Assignments._position_agrees, *_HISTORY),
    "open": (*_HISTORY, Assignments._opening_agrees),
    "same": _HISTORY,
    "again": _HISTORY,
}
CHECKS = tuple(dict.fromkeys(c for checks in EVIDENCE.values() for c in checks))  # each kind of evidence, once


def _rest(rows: list[int], out: dict[int, Any]) -> list[int]:
    """The rows not assigned yet."""
    return [r for r in rows if r not in out]


def _columns(call: Any, row: int) -> list[int] | None:
    """The row's 2-D mask over [cache | query] (`view.Padded`), where it was fed one."""
    view = call.views[row]
    return view.values if isinstance(view, Padded) else None


def _matchings(rows: list[int], options: dict[int, list[int]], capacity: list[int]) -> list[dict[int, int]]:
    """Distinct assignments row -> class within capacity that assign the most rows (at most MATCHINGS)."""
    found: list[dict[int, int]] = []
    best = [0]  # the most rows an assignment found so far assigns
    left = list(capacity)
    current: dict[int, int] = {}

    def walk(k: int) -> None:
        reach = len(current) + len(rows) - k  # the most this branch can still assign
        if reach < best[0] or (reach == best[0] and len(found) >= MATCHINGS):
            return
        if k == len(rows):
            if len(current) > best[0]:
                best[0], found[:] = len(current), []
            found.append(dict(current))
            return
        for c in options[rows[k]]:
            if left[c] > 0:
                current[rows[k]], left[c] = c, left[c] - 1
                walk(k + 1)
                del current[rows[k]]
                left[c] += 1
        walk(k + 1)  # the row left out (another row may hold its class)

    walk(0)
    return found
