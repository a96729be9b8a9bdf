"""What `follow.Follower` keeps while it walks an engine's target calls: each row read as a
sequence (`RowView`), each sequence as followed so far (`Seq`), and the row markers."""

from __future__ import annotations

from dataclasses import dataclass

from specviz.watch.calls import RowQuery

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
    # Its open step is the call after a prefill that fed the rest of its prompt's known part: a
    # chunk of the prompt or its pending token and drafts, which only the next call tells apart.
    in_prompt: bool = False
    refed: bool = False  # re-fed unchanged since `step`: read as finished if it never grows again
    finished: bool = False
