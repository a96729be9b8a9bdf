"""Where a draft head's input came from (`watch(target, drafter=head)`; invariant 6, head-input).

A head (EAGLE, MTP) is fed the target's last hidden state (its LM head's input) at the slot that
predicted the row's pending token. `HiddenTap` (a pre-hook on the LM head, only when a drafter is
named) keeps those of the target's latest HISTORY calls and matches each head row's fed vector with
them; `head_source` names the match as the row's [sequence, logical index]: a stale source (an
older call's) is named too and flagged by the check; a vector that matches nothing is left
unrecorded, never guessed.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

MAX_CANDIDATES = 4  # rows of one call holding the same vector (equal prompts): any is the same input
# Target calls whose hidden states are kept: the latest (a correct head's source) and the two before
# it (a stale source, or a sequence absent from the latest call, a newcomer's prefill between).
HISTORY = 3
RTOL, ATOL = 1e-4, 1e-5  # a copy or a dtype round trip of the vector, not another vector
# A head called inside a target call (MTP-like, on the final norm's output) is fed every query slot;
# the drafts come from the accepted slots, the last ones: only the last NESTED_TAIL are matched.
NESTED_TAIL = 16


class HiddenTap:
    """The target's last hidden states, [B, T, H], of each of its latest HISTORY recorded calls."""

    def __init__(self, target: Any) -> None:
        # [hidden states or None (LM head not run yet), query length], latest last; the hidden
        # states may be the query's last columns only (logits_to_keep).
        self.calls: deque[list[Any]] = deque(maxlen=HISTORY)
        self.open = False
        # Head calls made inside the open target call (MTP-like): their vectors are matched once the
        # call's own hidden states are kept (`end`), and their records follow the call's (`release`).
        self.deferred: list[tuple[torch.Tensor, int, list[list[tuple[int, int, int]]]]] = []
        self.held: list[Any] = []
        self.head = target.get_output_embeddings()
        self.handle = self.head.register_forward_pre_hook(self._capture)

    @property
    def last(self) -> torch.Tensor | None:
        """The latest call's hidden states (None until its LM head runs)."""
        return self.calls[-1][0] if self.calls else None

    def start(self, query_len: int) -> None:
        """A recorded target call begins: it is age 0 from now, the oldest kept one is dropped."""
        self.calls.append([None, query_len])
        self.open = True

    def end(self) -> None:
        """The recorded target call ends: the head calls made inside it are matched now (age 0)."""
        self.open = False
        for fed_rows, columns, found in self.deferred:
            for r, matches in enumerate(self._match(fed_rows, columns)):
                found[r].extend(matches)
        self.deferred = []

    def hold(self, record: Any) -> None:
        """A head call made inside the open target call, recorded after it (`release`) as a head
        called between target calls would be."""
        self.held.append(record)

    def release(self) -> list[Any]:
        held, self.held = self.held, []
        return held

    def remove(self) -> None:
        self.handle.remove()

    def _capture(self, module: Any, args: tuple[Any, ...]) -> None:
        # Only inside a target call: a head that shares the target's LM head calls it too.
        if self.open and args and isinstance(args[0], torch.Tensor) and args[0].dim() == 3:
            self.calls[-1][0] = args[0].detach().clone()  # an engine may reuse the buffer before the head reads it

    def match_rows(self, fed: dict[str, Any], args: tuple[Any, ...]) -> list[list[tuple[int, int, int]]] | None:
        """Per head row: the (age, target row, query column) of each kept hidden state equal to the
        vector fed at its last slot, latest call (age 0) first; None when nothing is kept or no
        vector of their width was fed. A head called inside the open target call is matched at
        `end` (its last NESTED_TAIL slots), which fills the lists returned."""
        width = self.width()
        if width is None:
            return None
        fed_tensors = (fed.get("hidden_states"), *args, *fed.values())  # the named one first
        vector = next((t for t in fed_tensors if _vectors(t, width)), None)
        if vector is None:
            return None
        vectors = vector.reshape(vector.shape[0], -1, width)  # [B, slots, H]
        if not self.open:
            return self._match(vectors[:, -1].detach(), 1)
        slots = vectors[:, -NESTED_TAIL:]
        found: list[list[tuple[int, int, int]]] = [[] for _ in range(slots.shape[0])]
        self.deferred.append((slots.detach().reshape(-1, width).clone(), slots.shape[1], found))
        return found

    def width(self) -> int | None:
        """The kept hidden states' width, else inside a target call its LM head's input features
        (None: neither, nothing to match with)."""
        kept = next((hidden for hidden, _ in reversed(self.calls) if hidden is not None), None)
        if kept is not None:
            return int(kept.shape[-1])
        if not self.open:
            return None
        features = getattr(self.head, "in_features", None)
        if isinstance(features, int):
            return features
        weight = getattr(self.head, "weight", None)
        return int(weight.shape[-1]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None

    def _match(self, fed_rows: torch.Tensor, columns: int) -> list[list[tuple[int, int, int]]]:
        """Per head row (`columns` rows of `fed_rows` each): its matches, latest call first, at most
        MAX_CANDIDATES a call for each slot fed."""
        found: list[list[tuple[int, int, int]]] = [[] for _ in range(fed_rows.shape[0] // columns)]
        for age, (hidden, query_len) in enumerate(reversed(self.calls)):
            if hidden is not None and hidden.shape[-1] == fed_rows.shape[-1]:
                per_slot = [0] * fed_rows.shape[0]  # the cap is per fed slot: each is its own vector
                for r, row, column in _matches(fed_rows, hidden, query_len):
                    if per_slot[r] < MAX_CANDIDATES:
                        per_slot[r] += 1
                        found[r // columns].append((age, row, column))
        return found


def _vectors(t: Any, width: int) -> bool:
    """A tensor of hidden states the width of the target's: [B, H] or [B, T, H]."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() in (2, 3) and t.shape[-1] == width


def _matches(fed_rows: torch.Tensor, kept: torch.Tensor, query_len: int) -> list[tuple[int, int, int]]:
    """(head row, target row, query column) of each kept hidden state ([B, T, H]) allclose to a fed
    row's vector. A head fed in a coarser dtype (fp16 on an fp32 trunk) is compared with the states
    rounded to it, within that dtype's rounding (`_tolerance`), never looser."""
    rtol = _tolerance(fed_rows.dtype, kept.dtype)
    if rtol > RTOL:
        kept = kept.to(fed_rows.dtype)
    fed_rows, kept = fed_rows.float(), kept.float()
    columns, width = kept.shape[1], kept.shape[-1]
    flat = kept.reshape(-1, width)
    # Squared distances by one product ([B, N], not [B, N, H]); the near ones are then confirmed.
    # Loose (the expansion cancels in float32): it only picks whom `allclose` then compares.
    norms = (fed_rows * fed_rows).sum(-1, keepdim=True)
    d2 = norms + (flat * flat).sum(-1) - 2 * fed_rows @ flat.T
    scale = 1e-3 * norms + 1e-6
    offset = max(query_len - columns, 0)  # logits_to_keep: the last columns only
    rows, near = torch.nonzero(d2 <= scale, as_tuple=True)
    # `allclose` on the near pairs at once: two host syncs per kept call, not one per row.
    same = ((flat[near] - fed_rows[rows]).abs() <= ATOL + rtol * fed_rows[rows].abs()).all(-1)
    return [(r, n // columns, offset + n % columns) for r, n in zip(rows[same].tolist(), near[same].tolist())]


def _tolerance(fed: torch.dtype, kept: torch.dtype) -> float:
    """RTOL, or for a vector fed in a floating dtype coarser than the kept one's, one unit in its
    last place (a cast in another order or kernel differs by less)."""
    if not kept.is_floating_point:  # the vector fed is floating (`_vectors`)
        return RTOL
    coarse, fine = torch.finfo(fed).eps, torch.finfo(kept).eps
    return max(RTOL, coarse) if coarse > fine else RTOL


class TapSet:
    """The command's taps (`specviz watch --drafter NAME`): the target is known only at the end, so
    every watched causal LM keeps its hidden states and a head call is matched with each; `resolve`
    keeps the target's."""

    def __init__(self) -> None:
        self.taps: dict[int, HiddenTap] = {}  # model index -> its tap

    def add(self, index: int, model: Any) -> HiddenTap:
        self.taps[index] = HiddenTap(model)
        return self.taps[index]

    def match_rows(self, fed: dict[str, Any], args: tuple[Any, ...]) -> dict[int, Any]:
        """`HiddenTap.match_rows` by model index (None: a model that kept no hidden states)."""
        return {i: tap.match_rows(fed, args) for i, tap in self.taps.items()}

    @property
    def open(self) -> bool:
        """A watched model's recorded call is in progress (a head called inside it)."""
        return any(tap.open for tap in self.taps.values())

    def hold(self, record: Any) -> None:
        """`HiddenTap.hold` on the model whose call is open."""
        next(tap for tap in self.taps.values() if tap.open).hold(record)

    def remove(self) -> None:
        for tap in self.taps.values():
            tap.remove()
        self.taps = {}


def resolve(matches: Any, target: int) -> list[list[tuple[int, int, int]]] | None:
    """A head call's matches (`TapSet.match_rows`, by model index) as the target's alone."""
    return matches.get(target)


def head_source(
    calls: list[Any], index: int, heads: list[int], row: int, drafts: list[int], seq_id: int, committed: int
) -> list[int] | None:
    """Row `row` of target call `index`: [sequence, logical index] of the hidden state its head was
    fed, read off the step's first head call (`heads`, latest first: later ones are fed the head's
    own features) through the target calls before it (a match's age counts them back). The
    expected source wins where several hold that vector, else the latest match. None: no head row
    can be told to have served this one, or its vector matched nothing (left unchecked)."""
    from specviz.watch.calls import row_seq_ids

    if not heads or not drafts:
        return None
    j = heads[-1]
    head_row = _served(calls[j], row, drafts, calls[index].batch_size)
    if head_row is None:  # else `_served` saw the head call's matches (`head_fed`)
        return None
    sources = [calls[i] for i in range(j - 1, -1, -1) if calls[i].role == "target"][:HISTORY]  # by age
    matched = [(sources[age], r, column) for age, r, column in calls[j].head_fed[head_row] if age < len(sources)]
    found = []
    for call, r, column in matched:
        place = _unpacked(call, r, column)
        inside = place is not None and place[0] < call.batch_size and place[1] < len(call.positions[place[0]])
        # not a pad slot's state (pads of several rows may hold one vector): no token's
        if inside and call.query_flags(place[0])[place[1]]:
            found.append([row_seq_ids(call)[place[0]], int(call.positions[place[0]][place[1]])])
    expected = [seq_id, committed - 2] if committed >= 2 else []
    return expected if expected in found else next(iter(found), None)


def _served(head: Any, row: int, drafts: list[int], batch_size: int) -> int | None:
    """The head call's row that proposed the verify row's drafts: in a batch of the verify's size the
    row's own (never another whose token happens to match), else the one row that did."""
    if not isinstance(head.argmax, list) or head.head_fed is None or len(head.argmax) != len(head.head_fed):
        return None

    def proposed(tokens: list[int]) -> bool:
        if len(tokens) > head.query_len:  # Medusa: one input slot, one logits column per head
            return list(tokens[: len(drafts)]) == list(drafts[: len(tokens)])
        if head.nested:  # fed every query slot: the accepted one's logits propose the next draft
            return drafts[0] in tokens
        return list(tokens[-1:]) == list(drafts[:1])  # EAGLE, MTP: the last slot's logits propose the next draft

    rows = [row] if head.batch_size == batch_size else range(len(head.argmax))
    found = [r for r in rows if proposed(head.argmax[r])]
    return found[0] if len(found) == 1 else None


def _unpacked(call: Any, row: int, column: int) -> tuple[int, int] | None:
    """A raw (row, column) of the call as its (row, column) after `batchmap.apply` unpacked it."""
    if call.segments is None:
        return row, column
    for i, (r, start, length) in enumerate(call.segments):
        if r == row and start <= column < start + length:
            return i, column - start
    return None  # padding between sequences


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
