"""What a watched script decoded (`specviz watch --`): the id lists it passed to a tokenizer's `decode`,
which show the tokens of a sequence's last step that no later call was fed. Only one distinct tail among
the lists that fit is taken; several, or none, leave the greedy reading."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import dropwhile
from typing import Any

MAX_LISTS = 10_000  # decoded lists kept at most: a script that decodes in a loop is not kept whole
MAX_IDS = 1_000_000  # ids kept at most over all lists


def id_lists(token_ids: Any) -> list[list[int]]:
    """The id lists in what a script passed to `decode`; none from anything else (never raises)."""
    value = _plain(token_ids)
    if not isinstance(value, (list, tuple)) or not value:
        return []
    value = [_plain(item) for item in value]  # a list of tensors or of numpy ints, one each
    if all(_is_id(t) for t in value):
        return [[int(t) for t in value]]
    if all(isinstance(row, (list, tuple)) and all(_is_id(t) for t in row) for row in value):
        return [[int(t) for t in row] for row in value if row]
    return []


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class DecodedLog:
    """The lists a script decoded, each with its tokenizer's pad id; bounded (`MAX_LISTS`, `MAX_IDS`)."""

    lists: list[tuple[list[int], int | None]] = field(default_factory=list)
    ids: int = 0
    full: bool = False  # a list was left out: past the bounds, nothing more is kept

    def add(self, token_ids: Any, pad: int | None) -> None:
        if self.full:
            return  # a streamer decodes at every step: past the bounds, no more conversion either
        for ids in id_lists(token_ids):
            if len(self.lists) >= MAX_LISTS or self.ids + len(ids) > MAX_IDS:
                self.full = True
                return
            self.lists.append((ids, pad))
            self.ids += len(ids)

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A `decode` that records its ids (the outermost call only, never raising), then decodes."""
        depth = [0]

        def decode(tokenizer: Any, token_ids: Any, *args: Any, **kwargs: Any) -> Any:
            if not depth[0]:
                try:
                    self.add(token_ids, getattr(tokenizer, "pad_token_id", None))
                except Exception:  # whatever the script passed, its decode goes on
                    pass
            depth[0] += 1
            try:
                return original(tokenizer, token_ids, *args, **kwargs)
            finally:
                depth[0] -= 1

        return decode

    def note(self) -> str | None:
        """What the run's notes say when lists were left out (their sequences may keep the greedy reading)."""
        if not self.full:
            return None
        return (
            f"decoded outputs: past {len(self.lists)} lists ({self.ids} ids) what the script decoded was "
            "no longer recorded; a last step none of the recorded lists shows is read as the target's choices"
        )


def strip_pads(ids: list[int], pads: Collection[int]) -> list[int]:
    """`ids` without the pad ids at either end (a padded batch's rows, left or right)."""
    padded = pads.__contains__  # (a pad id at either end)
    return list(dropwhile(padded, list(dropwhile(padded, ids))[::-1]))[::-1]


def tail_after(ids: list[int], prompt: list[int], seen: list[int], eos: Collection[int]) -> list[int] | None:
    """What `ids` add after the prompt and `seen` (or `seen` alone), up to an EOS; None: not this output."""
    for head in [prompt + seen, seen] if seen else [prompt]:
        if len(ids) > len(head) and ids[: len(head)] == head:
            rest = ids[len(head) :]
            return rest[: eos_cut(rest, eos)]
    return None


def eos_cut(tokens: list[int], eos: Collection[int]) -> int | None:
    """The length of `tokens` up to their first EOS (None: no EOS)."""
    return next((n + 1 for n, t in enumerate(tokens) if t in eos), None)


def decoded_tail(
    decoded: Iterable[tuple[list[int], int | None]],
    prompt: list[int],
    seen: list[int],
    eos: Collection[int],
    engine_pad: int | None = None,
) -> list[int] | None:
    """The one tail the decoded lists give a sequence (`tail_after`); None when none fits or two differ."""
    tails = set()
    for ids, pad in decoded:
        pads = {pad, engine_pad} - {None}
        tail = tail_after(strip_pads(ids, pads), strip_pads(prompt, pads), seen, eos)
        if tail is not None:
            tails.add(tuple(tail))
    return list(next(iter(tails))) if len(tails) == 1 else None


def takes(tail: list[int], read: list[int], greedy: list[int], most: int, eos: Collection[int]) -> bool:
    """Does the decoded `tail` replace the last step read as `read` (within `most`, a budget, an EOS)?"""
    if len(tail) > most:
        return False
    if len(read) < len(greedy) and len(tail) > len(read):
        return False
    lost_eos = len(tail) < len(read) and read[-1] in eos and tail == read[: len(tail)]
    return not lost_eos
