"""Where a draft head's input came from (`watch(target, drafter=head)`; invariant 6, head-input).
`HiddenTap`, a pre-hook on the target's LM head, keeps its last hidden states of its latest HISTORY
calls and matches each head row's fed vector with them; `head_source` names the match as the row's
[sequence, logical index] (docs/watch-heads.md)."""

from __future__ import annotations

from collections import deque
from itertools import groupby, islice
from operator import itemgetter
from typing import Any

import torch

MAX_CANDIDATES = 4  # rows of one call holding the same vector (equal prompts): any is the same input
HISTORY = 3  # target calls kept: the latest (a correct source) and two before (stale, or a newcomer's prefill between)
RTOL, ATOL = 1e-4, 1e-5  # a copy or a dtype round trip of the vector, not another vector
NESTED_TAIL = 16  # a head called inside a target call is fed every query slot: its last ones are matched
Matches = list[list[tuple[int, int, int]]]  # per head row: (age, target row, query column) of each match


class HiddenTap:
    """The target's last hidden states, [B, T, H], of each of its latest HISTORY recorded calls."""

    def __init__(self, target: Any) -> None:
        self.calls: deque[list[Any]] = deque(maxlen=HISTORY)  # [states (None: LM head not run), query length]
        self.open = False
        self.deferred: list[tuple[torch.Tensor, int, Matches]] = []  # head calls inside the open call
        self.held: list[Any] = []  # their records (`hold`), recorded after the target call's
        self.head = target.get_output_embeddings()
        self.features = getattr(self.head, "in_features", None)  # the LM head's input width (nn.Linear's)
        self.handle = self.head.register_forward_pre_hook(self._capture)

    @property
    def last(self) -> torch.Tensor | None:
        """The latest call's hidden states (None until its LM head runs)."""
        return self.calls[-1][0]

    def start(self, query_len: int) -> None:
        """A recorded target call begins: age 0 from now (the oldest kept one is dropped)."""
        self.calls.append([None, query_len])
        self.open = True

    def end(self) -> list[Any]:
        """The recorded target call ends: the head calls made inside it are matched now (age 0)."""
        self.open = False
        for fed_rows, columns, found in self.deferred:
            for r, matches in enumerate(self._match(fed_rows, columns)):
                found[r].extend(matches)
        self.deferred, held, self.held = [], self.held, []
        return held

    def hold(self, record: Any) -> None:
        self.held.append(record)

    def remove(self) -> None:
        self.handle.remove()

    def _capture(self, module: Any, args: tuple[Any, ...]) -> None:
        if self.open and args and args[0].dim() == 3:  # a head sharing the LM head calls it too, outside
            self.calls[-1][0] = args[0].detach().clone()  # an engine may reuse the buffer before the head reads it
            self.features = args[0].shape[-1]

    def match_rows(self, fed: dict[str, Any], args: tuple[Any, ...]) -> Matches | None:
        """Per head row, the matches of the vector fed at its last slot (inside the open target call: its
        last NESTED_TAIL slots, filled in at `end`); None: nothing kept, or no vector of that width fed."""
        width = self.features if self.open or any(hidden is not None for hidden, _ in self.calls) else None
        fed_tensors = (fed.get("hidden_states"), *args, *fed.values())
        vector = next((t for t in fed_tensors if _vectors(t, width)), None)
        if vector is None:
            return None
        vectors = vector.reshape(vector.shape[0], -1, width)  # [B, slots, H]
        if not self.open:
            return self._match(vectors[:, -1].detach(), 1)
        slots = vectors[:, -NESTED_TAIL:]
        found: Matches = [[] for _ in range(slots.shape[0])]
        self.deferred.append((slots.detach().reshape(-1, width).clone(), slots.shape[1], found))
        return found

    def _match(self, fed_rows: torch.Tensor, columns: int) -> Matches:
        """Per head row (`columns` rows of `fed_rows`), latest call first: MAX_CANDIDATES per call and slot."""
        found: Matches = [[] for _ in range(fed_rows.shape[0] // columns)]
        for age, (hidden, query_len) in enumerate(reversed(self.calls)):
            if hidden is not None:  # one LM head: every kept state has the width of the fed rows
                for r, same in groupby(_matches(fed_rows, hidden, query_len), key=itemgetter(0)):
                    found[r // columns] += [(age, row, column) for _, row, column in islice(same, MAX_CANDIDATES)]
        return found


def _vectors(t: Any, width: int | None) -> bool:  # hidden states: floating [B, H] or [B, T, H]
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() in (2, 3) and t.shape[-1] == width


def _matches(fed_rows: torch.Tensor, kept: torch.Tensor, query_len: int) -> list[tuple[int, int, int]]:
    """(head row, target row, query column) of each kept state allclose to a fed row, in the fed dtype."""
    coarse, fine = torch.finfo(fed_rows.dtype).eps, torch.finfo(kept.dtype).eps
    rtol = max(RTOL, coarse) if coarse > fine else RTOL
    fed_rows, kept = fed_rows.float(), kept.to(fed_rows.dtype).float()  # rounded to the fed dtype
    columns, flat = kept.shape[1], kept.reshape(-1, kept.shape[-1])
    # Squared distances by one product ([B, N], not [B, N, H]), loose: only picks pairs to confirm.
    norms = (fed_rows * fed_rows).sum(-1, keepdim=True)
    d2 = norms + (flat * flat).sum(-1) - 2 * fed_rows @ flat.T
    rows, near = torch.nonzero(d2 <= 1e-3 * norms + 1e-6, as_tuple=True)  # row-major: by head row
    same = ((flat[near] - fed_rows[rows]).abs() <= ATOL + rtol * fed_rows[rows].abs()).all(-1)
    offset = max(query_len - columns, 0)  # logits_to_keep: the last columns only
    return [(r, n // columns, offset + n % columns) for r, n in zip(rows[same].tolist(), near[same].tolist())]


class TapSet(dict):
    """The command's taps by model index (`--drafter NAME`): the target is known only at the end, so
    every watched causal LM keeps its hidden states and a head call is matched with each (`resolve`)."""

    def add(self, index: int, model: Any) -> HiddenTap:
        self[index] = HiddenTap(model)
        return self[index]

    def match_rows(self, fed: dict[str, Any], args: tuple[Any, ...]) -> dict[int, Any]:
        return {i: tap.match_rows(fed, args) for i, tap in self.items()}

    @property
    def open(self) -> bool:
        return any(tap.open for tap in self.values())

    def hold(self, record: Any) -> None:
        next(tap for tap in self.values() if tap.open).hold(record)  # the model whose call is open

    def remove(self) -> None:
        for tap in self.values():
            tap.remove()
        self.clear()


def resolve(matches: Any, target: int) -> Matches | None:
    """A head call's matches (`TapSet.match_rows`, by model index) as the target's alone."""
    return matches.get(target)


def head_source(
    calls: list[Any], index: int, heads: list[int], row: int, drafts: list[int], seq_id: int, committed: int
) -> list[int] | None:
    """Row `row` of target call `index`: [sequence, logical index] of the hidden state its head was fed
    (docs/watch-heads.md); None: no head row served it, or its vector matched nothing."""
    if not heads or not drafts:
        return None
    j = heads[-1]  # the step's first head call: the one fed the target's states
    target_calls = (calls[i] for i in range(j - 1, -1, -1) if calls[i].role == "target")
    sources = list(islice(target_calls, HISTORY))  # by age
    fed = _served(calls[j], row, drafts, calls[index].batch_size)
    found = [place for age, r, column in fed if age < len(sources) for place in _places(sources[age], r, column)]
    expected = [seq_id, committed - 2]
    return expected if expected in found else next(iter(found), None)


def _served(head: Any, row: int, drafts: list[int], batch_size: int) -> list[tuple[int, int, int]]:
    """The matches of the head row that proposed the verify row's drafts: in a batch of the verify's
    size the row's own, else the one row that did ([]: none, or several)."""
    if not isinstance(head.argmax, list) or head.head_fed is None or len(head.argmax) != len(head.head_fed):
        return []

    def proposed(tokens: list[int]) -> bool:
        if len(tokens) > head.query_len:  # Medusa: one input slot, one logits column per head
            return list(tokens[: len(drafts)]) == list(drafts[: len(tokens)])
        if head.nested:  # fed every query slot: the accepted one's logits propose the next draft
            return drafts[0] in tokens
        return list(tokens[-1:]) == list(drafts[:1])  # EAGLE, MTP: the last slot's logits propose the next draft

    rows = [row] if head.batch_size == batch_size else range(len(head.argmax))
    found = [r for r in rows if proposed(head.argmax[r])]
    return head.head_fed[found[0]] if len(found) == 1 else []


def _places(call: Any, row: int, column: int) -> list[list[int]]:
    """[sequence, position] at a raw (row, column) of the call as `batchmap.apply` unpacked it; none at
    padding (pads of several rows may hold one vector) or outside the call."""
    spans = call.segments if call.segments is not None else [(r, 0, call.query_len) for r in range(call.batch_size)]
    at = [(i, column - start) for i, (r, start, n) in enumerate(spans) if r == row and start <= column < start + n]
    return [[call.seq_ids[i], int(call.positions[i][c])] for i, c in at if call.views[i].flags[c]]


def unfound_note(steps: list[Any]) -> list[str]:
    """A note on the drafting rows whose head input matched no kept hidden state (unchecked)."""
    drafting = [(step.step, row) for step in steps for row in step.rows if row.draft_tokens]
    missing = [at for at, row in drafting if row.head_source is None]  # the steps, in order
    if not missing:
        return []
    return [
        f"draft head input unreadable for {len(missing)} of {len(drafting)} drafting rows (first at step "
        f"{missing[0]}): the vector fed matched no last hidden state of the target's last {HISTORY} calls; "
        "head-input not checked there"
    ]
