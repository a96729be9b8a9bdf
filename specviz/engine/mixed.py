"""Mixed forwards: a waiting prompt's next prefill chunk rides in the running rows' verify forward.

EXSPEC with `--prefill-chunk N` admits a sequence by prefilling its context N tokens at a time.
Instead of a target forward of its own per chunk, the chunk is a *rider*: an extra row of the
step's verify forward, after the B verify rows. One forward then carries [B verify rows | R
rider rows]; its inputs are built here (`_Mixed`) and its outputs split back:

  cache part [B + R, Wc]: each row's own slots, left-padded to Wc = the widest row's cached slots
      (verify rows: the batch's W; a rider: the L chunks it cached so far, in its own cache);
  query part [B + R, Q]: a verify row's [pending, d1..dk], a rider's chunk of c <= N tokens, each
      right-padded to Q = the longest (padding after the real tokens, so causality within the
      block is the physical order, as in `feed`, and no real token attends a pad);
  positions: a verify row's as the step computed them; a rider's start .. start + c - 1.

The verify rows get back their logits [B, k+1, V] and a cache of [their W slots | k+1 written]
(the pad query slots are cut off), exactly what `feed` leaves; each rider gets its cache grown by
its chunk and the target's choice after the chunk (for the draft's next boundary). With no verify
rows (no sequence is ready yet) the same builder runs the riders' chunks in a forward of their
own. The draft model is fed each rider's chunk in a draft forward of its own (`feed_draft`),
never in a verify forward: the step's draft forwards are the proposals, one token per row.

A rider's chunks are recorded like a chunked prefill's (`prefill.PrefillRecord`), each with the
step whose verify forward carried it (`carrier`; -1: a forward of its own): the trace's
`prefill_chunks` (schema 5) and the chunk-continuity checks (`analysis/prefill_checks.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specviz.engine.kv.headroom import HeadroomLayer
from specviz.engine.kv.state import KVState, cache_layers, feed
from specviz.engine.prefill import PrefillRecord

if TYPE_CHECKING:
    from specviz.engine.batch import SeqState
    from specviz.engine.faults import Fault

NO_CARRIER = -1  # a chunk fed in a forward of its own


@dataclass
class Rider:
    """A sequence whose context is being prefilled a chunk at a time, until it is admitted."""

    seq: SeqState
    context: list[int]  # every committed token but the pending one: what the prefill caches
    record: PrefillRecord
    target: KVState  # one row: the chunks cached so far, no padding
    draft: KVState | None  # None: no draft model
    chunk: tuple[int, int] = (0, 0)  # context span [start, end) of this step's chunk

    @property
    def cached(self) -> int:
        return self.chunk[0]

    @property
    def complete(self) -> bool:
        """Every context token cached in the target (the draft is fed in the same step)."""
        return self.chunk[1] >= len(self.context)


def open_rider(seq: SeqState, record: PrefillRecord, device: torch.device, with_draft: bool) -> Rider:
    """A waiting sequence's rider: empty caches; `record` (`prefill.chunk_records`) is kept on the
    run until its first step."""
    context = seq.prompt_ids + seq.output_ids[:-1] if seq.output_ids else seq.prompt_ids[:-1]
    return Rider(seq, context, record, _empty(device), _empty(device) if with_draft else None)


@dataclass
class Aboard:
    """One step's riders, each with its next chunk, and what their forwards need.

    A batch holds it (`Batch.riders`); the step's verify calls `verify` instead of `feed`."""

    riders: list[Rider]
    pad_id: int
    device: torch.device
    fault: Fault  # its `draft_chunk_tokens` hook decides the draft's feed at a chunk boundary

    def __bool__(self) -> bool:
        return bool(self.riders)

    def next_chunks(self, size: int) -> None:
        """Each rider's next span of at most `size` context tokens, after what it cached."""
        for rider in self.riders:
            start = rider.chunk[1]
            rider.chunk = (start, min(len(rider.context), start + size))

    def verify(
        self, model: Any, state: KVState, query: torch.Tensor, positions: torch.Tensor, step: int
    ) -> torch.Tensor:
        """The verify forward of `state`'s rows over `query` [B, k+1] at `positions`, carrying each
        rider's chunk (recorded as carried by `step`); returns the verify rows' logits
        [B, k+1, V] and leaves `state` as `feed` would."""
        mixed = _Mixed(self, model, True, state, query, positions)
        logits = mixed.forward()
        mixed.note_target(logits, carrier=step)
        return mixed.split_verify(logits)

    def prefill(self, model: Any) -> None:
        """The riders' chunks in a target forward of their own (no verify rows to carry them)."""
        if self.riders:
            mixed = _Mixed(self, model, True)
            mixed.note_target(mixed.forward(), carrier=NO_CARRIER)

    def feed_draft(self, model: Any | None) -> None:
        """The riders' chunks fed to the draft, in one draft forward of their own.

        At a chunk boundary (a chunk after the first) the fault hook may swap the chunk's first
        token for the target's choice after the previous chunk (the `chunk-boundary-feed` fault)."""
        if model is not None and self.riders:
            _Mixed(self, model, False).forward()


class _Mixed:
    """One forward of `model` over [verify rows of `state` | riders], built and split."""

    def __init__(
        self,
        aboard: Aboard,
        model: Any,
        is_target: bool,
        state: KVState | None = None,
        query: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> None:
        self.aboard, self.riders, self.model, self.is_target = aboard, aboard.riders, model, is_target
        self.state, self.query, self.positions = state, query, positions
        self.verify_rows = state.batch_size if state is not None else 0
        self.verify_query = query.shape[1] if query is not None else 0
        self.own = [r.target if is_target else r.draft for r in self.riders]  # each rider's state of `model`

    def _rider_tokens(self) -> list[list[int]]:
        tokens = [r.context[r.chunk[0] : r.chunk[1]] for r in self.riders]
        if self.is_target or not any(r.cached for r in self.riders):
            return tokens
        device = self.aboard.device
        width = max(len(t) for t in tokens)
        fed = torch.tensor([t + [0] * (width - len(t)) for t in tokens], device=device)  # [R, c]
        predicted = torch.tensor([r.record.predicted.get(r.cached, -1) for r in self.riders], device=device)
        boundary = torch.tensor([bool(r.cached) and bool(t) for r, t in zip(self.riders, tokens)], device=device)
        fed = self.aboard.fault.draft_chunk_tokens(fed, predicted, boundary.long(), [r.seq.seq_id for r in self.riders])
        return [fed[i, : len(t)].tolist() for i, t in enumerate(tokens)]

    def forward(self) -> torch.Tensor:
        """Logits [B + R, Q, V] of the mixed forward; every row's cache grows by its real tokens."""
        device, pad = self.aboard.device, self.aboard.pad_id
        tokens = self._rider_tokens()
        self.fed = tokens
        rows = self.verify_rows + len(self.riders)
        self.old_width = self.state.width if self.state is not None else 0
        self.cached = [s.width for s in self.own]
        width = max([self.old_width, *self.cached])  # Wc
        query_len = max([self.verify_query, *(len(t) for t in tokens)])  # Q
        ids = torch.full((rows, query_len), pad, dtype=torch.long, device=device)  # [B+R, Q]
        positions = torch.zeros(rows, query_len, dtype=torch.long, device=device)  # [B+R, Q]
        query_mask = torch.zeros(rows, query_len, dtype=torch.long, device=device)  # [B+R, Q]
        cache_mask = torch.zeros(rows, width, dtype=torch.long, device=device)  # [B+R, Wc]
        b, q = self.verify_rows, self.verify_query
        if b:
            ids[:b, :q], positions[:b, :q], query_mask[:b, :q] = self.query, self.positions, 1
            positions[:b, q:] = self.positions[:, -1:]  # pads: a valid position, never attended
            cache_mask[:b, width - self.old_width :] = self.state.mask
        for i, (rider, fed) in enumerate(zip(self.riders, tokens)):
            row, count, start = b + i, len(fed), rider.cached
            ids[row, :count] = torch.tensor(fed, dtype=torch.long, device=device)
            positions[row] = start + torch.arange(query_len, device=device).clamp(max=max(count - 1, 0))
            query_mask[row, :count] = 1
            cache_mask[row, width - self.cached[i] :] = 1
        if b and self.is_target:  # a verify forward carries the chunks
            seq_ids = [r.seq.seq_id for r in self.riders]
            positions[b:] = self.aboard.fault.rider_positions(positions[b:], width, seq_ids)
        self.width, self.query_len = width, query_len
        self.rider_positions = positions[b:, 0].tolist()
        mixed = KVState(cache=self._cache(rows, width, query_len), mask=cache_mask, next_pos=positions[:, 0])
        logits = feed(self.model, mixed, ids, positions, query_mask=query_mask)  # [B+R, Q, V]
        self.mixed = mixed
        self._split_riders()
        return logits

    def _cache(self, rows: int, width: int, query_len: int) -> Any | None:
        """Every row's cached slots, left-padded to `width`, in buffers with room for the query."""
        sources = ([self.state] if self.verify_rows else []) + self.own
        layered = [s for s in sources if s.cache is not None and s.width]
        if not layered:
            return None
        like = cache_layers(layered[0].cache)
        cache = DynamicCache()
        capacity = width + query_len  # the forward writes its Q query slots in place
        for i, layer in enumerate(like):
            keys = layer.keys.new_zeros(rows, layer.keys.shape[1], capacity, layer.keys.shape[-1])
            values = layer.values.new_zeros(rows, layer.values.shape[1], capacity, layer.values.shape[-1])
            row = 0
            for source in sources:
                count = source.batch_size
                if source.cache is not None and source.width:
                    held = cache_layers(source.cache)[i]
                    keys[row : row + count, :, width - source.width : width] = held.keys[:, :, : source.width]
                    values[row : row + count, :, width - source.width : width] = held.values[:, :, : source.width]
                row += count
            mixed = HeadroomLayer(0)
            mixed.hold(keys, values, width)
            cache.layers.append(mixed)
        return cache

    def _split_riders(self) -> None:
        """Each rider's own state of `model`, grown by its chunk (a contiguous copy of its row)."""
        b, width = self.verify_rows, self.width
        layers = cache_layers(self.mixed.cache) if self.mixed.cache is not None else []
        for i, (rider, fed) in enumerate(zip(self.riders, self.fed)):
            before, count = self.cached[i], len(fed)
            new = before + count
            cache = None
            if layers and new:
                cache = DynamicCache()
                for layer in layers:
                    own = DynamicLayer()
                    keys = layer.keys[b + i : b + i + 1, :, width - before : width + count].contiguous()
                    values = layer.values[b + i : b + i + 1, :, width - before : width + count].contiguous()
                    own.lazy_initialization(keys, values)
                    own.keys, own.values = keys, values
                    cache.layers.append(own)
            device = self.aboard.device
            state = KVState(
                cache=cache,
                mask=torch.ones(1, new, dtype=torch.long, device=device),
                next_pos=torch.tensor([new], device=device),
            )
            if self.is_target:
                rider.target = state
            else:
                rider.draft = state
                rider.record.draft_fed = (rider.record.draft_fed or []) + fed

    def note_target(self, logits: torch.Tensor, carrier: int) -> None:
        """Record each rider's target chunk, [start, end, first position, slots before, carrier],
        and the target's choice after it (what a faulty draft feed would take at the next boundary)."""
        b = self.verify_rows
        for i, (rider, fed) in enumerate(zip(self.riders, self.fed)):
            if not fed:
                continue
            start, end = rider.chunk
            rider.record.chunks.append([start, end, self.rider_positions[i], self.cached[i], carrier])
            rider.record.predicted[end] = int(logits[b + i, len(fed) - 1].argmax(-1))

    def split_verify(self, logits: torch.Tensor) -> torch.Tensor:
        """The verify rows' logits [B, k+1, V]; their state left as `feed` leaves it: the old mask
        plus k+1 attended query slots, the cache [their W old slots | k+1 written] (pads cut off)."""
        b, q, width, state = self.verify_rows, self.verify_query, self.width, self.state
        start = width - self.old_width
        if self.mixed.cache is not None:
            if state.cache is None:
                state.cache = DynamicCache()
            own = cache_layers(state.cache)
            for i, layer in enumerate(cache_layers(self.mixed.cache)):
                keys = layer.keys[:b, :, start : width + q]
                values = layer.values[:b, :, start : width + q]
                if i >= len(own):
                    own.append(DynamicLayer())
                    own[i].lazy_initialization(keys, values)
                # Not a view of this layer's own buffer: its next update adopts them with one copy.
                own[i].keys, own[i].values = keys, values
        state.mask = torch.cat([state.mask, torch.ones(b, q, dtype=state.mask.dtype, device=state.mask.device)], 1)
        state.query_attends = None
        return logits[:b, :q]


def _empty(device: torch.device) -> KVState:
    mask = torch.zeros(1, 0, dtype=torch.long, device=device)
    return KVState(cache=None, mask=mask, next_pos=torch.zeros(1, dtype=torch.long, device=device))
