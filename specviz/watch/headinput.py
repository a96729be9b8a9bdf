"""Where a draft head's input came from (`watch(target, drafter=head)`; invariant 6, head-input).

`HiddenTap` (a pre-hook on the target's LM head, only when a drafter is named) keeps the target's
last hidden states of its latest HISTORY calls and matches each head row's fed vector with them;
`head_source` names the match as the row's [sequence, logical index] (docs/watch-heads.md)."""

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


class HiddenTap:
    """The target's last hidden states, [B, T, H], of each of its latest HISTORY recorded calls."""

    def __init__(self, target: Any) -> None:
        # [hidden states (None: LM head not run yet; maybe the last columns only), query length]
        self.calls: deque[list[Any]] = deque(maxlen=HISTORY)
        self.open = False
        # Head calls made inside the open target call: matched at `end`, recorded after it (`release`).
        self.deferred: list[tuple[torch.Tensor, int, list[list[tuple[int, int, int]]]]] = []
        self.held: list[Any] = []
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

    def end(self) -> None:
        """The recorded target call ends: the head calls made inside it are matched now (age 0)."""
        self.open = False
        for fed_rows, columns, found in self.deferred:
            for r, matches in enumerate(self._match(fed_rows, columns)):
                found[r].extend(matches)
        self.deferred = []

    def hold(self, record: Any) -> None:
        """A head call made inside the open target call, recorded after it (`release`)."""
        self.held.append(record)

    def release(self) -> list[Any]:
        held, self.held = self.held, []
        return held

    def remove(self) -> None:
        self.handle.remove()

    def _capture(self, module: Any, args: tuple[Any, ...]) -> None:
        # Only inside a target call: a head that shares the target's LM head calls it too.
        if self.open and args and args[0].dim() == 3:
            self.calls[-1][0] = args[0].detach().clone()  # an engine may reuse the buffer before the head reads it
            self.features = args[0].shape[-1]

    def match_rows(self, fed: dict[str, Any], args: tuple[Any, ...]) -> list[list[tuple[int, int, int]]] | None:
        """Per head row: the (age, target row, query column) of each kept hidden state equal to the
        vector fed at its last slot (inside the open target call: its last NESTED_TAIL slots, filled
        in at `end`); None when nothing is kept or no vector of their width was fed."""
        # The LM head's input width while a state is kept or a target call is open (None: nothing to match)
        width = self.features if self.open or any(hidden is not None for hidden, _ in self.calls) else None
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

    def _match(self, fed_rows: torch.Tensor, columns: int) -> list[list[tuple[int, int, int]]]:
        """Per head row (`columns` rows of `fed_rows`): its matches, latest call first, at most
        MAX_CANDIDATES a call for each slot fed."""
        found: list[list[tuple[int, int, int]]] = [[] for _ in range(fed_rows.shape[0] // columns)]
        for age, (hidden, query_len) in enumerate(reversed(self.calls)):
            if hidden is not None:  # one LM head: every kept state has the width of the fed rows
                for r, same in groupby(_matches(fed_rows, hidden, query_len), key=itemgetter(0)):
                    found[r // columns] += [(age, row, column) for _, row, column in islice(same, MAX_CANDIDATES)]
        return found


def _vectors(t: Any, width: int | None) -> bool:
    """A tensor of hidden states the width of the target's: [B, H] or [B, T, H]."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() in (2, 3) and t.shape[-1] == width


def _matches(fed_rows: torch.Tensor, kept: torch.Tensor, query_len: int) -> list[tuple[int, int, int]]:
    """(head row, target row, query column) of each kept hidden state ([B, T, H]) allclose to a fed
    row's vector, by head row. A head fed in a coarser dtype (fp16 on an fp32 trunk) is compared with
    the states rounded to it, within one unit in its last place (a cast in another order or kernel
    differs by less), never looser than RTOL."""
    coarse, fine = torch.finfo(fed_rows.dtype).eps, torch.finfo(kept.dtype).eps
    rtol = max(RTOL, coarse) if coarse > fine else RTOL
    # Rounded to the fed dtype (a no-op or an exact widening unless that dtype is coarser).
    fed_rows, kept = fed_rows.float(), kept.to(fed_rows.dtype).float()
    columns, width = kept.shape[1], kept.shape[-1]
    flat = kept.reshape(-1, width)
    # Squared distances by one product ([B, N], not [B, N, H]), loose (the expansion cancels in
    # float32): it only picks the near pairs, which `allclose` then confirms.
    norms = (fed_rows * fed_rows).sum(-1, keepdim=True)
    d2 = norms + (flat * flat).sum(-1) - 2 * fed_rows @ flat.T
    scale = 1e-3 * norms + 1e-6
    offset = max(query_len - columns, 0)  # logits_to_keep: the last columns only
    rows, near = torch.nonzero(d2 <= scale, as_tuple=True)  # row-major: by head row
    # `allclose` on the near pairs at once: two host syncs per kept call, not one per row.
    same = ((flat[near] - fed_rows[rows]).abs() <= ATOL + rtol * fed_rows[rows].abs()).all(-1)
    return [(r, n // columns, offset + n % columns) for r, n in zip(rows[same].tolist(), near[same].tolist())]


class TapSet:
    """The command's taps (`--drafter NAME`): the target is known only at the end, so every watched
    causal LM keeps its hidden states and a head call is matched with each (`resolve`)."""

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
    fed, read off the step's first head call (`heads`, latest first) through the target calls
    before it (a match's age counts them back): the expected source where several hold that
    vector, else the latest match. None: no head row served it, or its vector matched nothing."""
    from specviz.watch.calls import row_seq_ids

    if not heads or not drafts:
        return None
    j = heads[-1]
    head_row = _served(calls[j], row, drafts, calls[index].batch_size)
    if head_row is None:  # else `_served` saw the head call's matches (`head_fed`)
        return None
    sources = [calls[i] for i in range(j - 1, -1, -1) if calls[i].role == "target"][:HISTORY]  # by age
    matched = [(sources[age], r, column) for age, r, column in calls[j].head_fed[head_row] if age < len(sources)]
    places = [(call, _unpacked(call, r, column)) for call, r, column in matched]
    # not a pad slot's state (pads of several rows may hold one vector): no token's
    found = [[row_seq_ids(c)[p[0]], int(c.positions[p[0]][p[1]])] for c, p in places if p and c.query_flags(p[0])[p[1]]]
    expected = [seq_id, committed - 2]
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
    """A raw (row, column) of the call as its (row, column) after `batchmap.apply` unpacked it;
    None: padding between sequences, or outside the call (a state of another shape kept)."""
    spans = call.segments if call.segments is not None else [(r, 0, call.query_len) for r in range(call.batch_size)]
    inside = (i for i, (r, start, length) in enumerate(spans) if r == row and start <= column < start + length)
    return next(((i, column - spans[i][1]) for i in inside), None)


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
