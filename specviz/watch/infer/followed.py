"""What `follow.Follower` keeps while it walks the target calls: a row read as a sequence (`RowView`),
a sequence followed so far (`Seq`) with its open step as fed (`Step`), and the row markers."""

from __future__ import annotations

from dataclasses import dataclass

from specviz.watch.calls import RowQuery
from specviz.watch.credit import matched_prefix

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
    position: int = -1  # the position fed to the pending token (-1: the engine fed none)

    def refeeds(self, context: list[int]) -> bool:
        """The query tokens fed before the pending one are the sequence's at those slots (where they fall
        within `context`)."""
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
    refed: bool = False  # re-fed unchanged since `step`: read as finished if it never grows again
    finished: bool = False
    out: bool = False  # left out of a call that held others of its last call: gone, or sat out (`_returning`)
    # A newcomer prefilled over another request's KV: the stale slots its first token attended and
    # the position fed there, which its rows are read from (`Follower._view`).
    base: tuple[int, int] = (0, 0)

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
    most: int = 0  # the most tokens it could commit: its drafts (a tree's deepest path) + 1

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
        """Could a step that took `took` drafts commit `token` last: the target's choice there (any, if
        none kept), or that draft (no bonus kept)."""
        return 0 <= took <= len(self.drafts) and (
            not self.targets or token == self.targets[took] or took < len(self.drafts) and token == self.drafts[took]
        )
