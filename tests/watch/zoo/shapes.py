"""Pieces the production-shaped engines share (`packed`, `queue`, `paged`, `head`), written with
plain Hugging Face forwards (nothing from specviz).

`budgets`: each prompt's own `max_new_tokens` (an int is one budget for all).
`reference`: batch-1 greedy decoding of the target, with a cache, to each prompt's own budget or
its end-of-sequence token: the oracle the tests hold every correct engine to, computed outside any
watch. `until_eos` cuts an engine's accepted tokens there, as every engine here does.
`SharedKV`: one 1-row cache that every sequence appends its slots to (slots never move, never
reused); `forward` feeds a packed 1 x T row, each sequence's query tokens back to back with their
own positions, and a block-diagonal additive 4-D mask that lets each query token see its own
sequence's live slots plus the tokens before it in its own query.
`SlotKV`: the same over a fixed pool of slots, as vLLM's slot mapping: each fed token is written
to the lowest free slot (`slot_mapping`, read by `SlotPool.update`), a freed slot (a rejected
draft, a finished sequence) is reused by the next call, and the mask's keys are the pool's slots.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

NEG = torch.finfo(torch.float32).min


def budgets(max_new: int | list[int], n: int) -> list[int]:
    return list(max_new) if isinstance(max_new, (list, tuple)) else [max_new] * n


def eos_ids(model) -> set[int]:
    """The model's end-of-sequence ids (its generation config's, else its config's)."""
    for source in (getattr(model, "generation_config", None), model.config):
        raw = getattr(source, "eos_token_id", None)
        if raw is not None:
            return {raw} if isinstance(raw, int) else set(raw)
    return set()


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The tokens up to and including the first end-of-sequence id (an engine stops there)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def settle(out: list[int], accepted: list[int], limit: int, eos: set[int]) -> tuple[list[int], str | None]:
    """What an engine appends to `out` of the tokens its verify accepted (cut after an
    end-of-sequence id), and the sequence's finish reason, if this ends it."""
    tokens = until_eos(accepted, eos)
    if tokens[-1] in eos:
        return tokens, "eos"
    return tokens, "length" if len(out) + len(tokens) >= limit else None


def commit(seq: int, tokens: list[int], finish: str | None, seqs, outs, done: set[int], w) -> None:
    """Append what the step gave `seq` to its sequence and output, tell the watch (when watched),
    and mark it done when it ended."""
    seqs[seq] += tokens
    outs[seq] += tokens
    if w is not None:
        w.emit(seq, tokens, finish)
    if finish:
        done.add(seq)


@torch.no_grad()
def reference(target, prompts: list[list[int]], max_new: int | list[int], eos: int | None = None) -> list[list[int]]:
    """Batch-1 greedy continuations, one prompt at a time (no padding, no packing), each to its
    budget or through its first end-of-sequence token (`eos`, else the model's)."""
    stop = {eos} if eos is not None else eos_ids(target)
    outs = []
    for prompt, n in zip(prompts, budgets(max_new, len(prompts))):
        ids, cache, out = torch.tensor([prompt]), DynamicCache(), []
        while len(out) < n and (not out or out[-1] not in stop):
            logits = target(input_ids=ids, cache=cache, use_cache=True).logits
            out.append(int(logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
        outs.append(out)
    return outs


class SharedKV:
    """A model's cache as one shared row of slots: `owner[i]` is the sequence slot i belongs to,
    `live[i]` whether it is still attended (a rejected draft's slot is dropped, never reused)."""

    def __init__(self, model, embeds: bool = False, flash: bool = False) -> None:
        self.model = model
        self.embeds = embeds  # feed `inputs_embeds` (the model's own embedding rows), not `input_ids`
        # flash: a boolean mask (True: attended) plus the varlen metadata flash attention takes
        # (`cu_seq_lens_q/k`, `max_length_q/k`; sdpa ignores them), as transformers' CB passes.
        self.flash = flash
        self.before = None  # called with the chunks before each forward (an engine that declares them)
        self.cache = DynamicCache()
        self.owner: list[int] = []
        self.live: list[bool] = []

    @torch.no_grad()
    def forward(
        self,
        chunks: list[tuple[int, list[int], int]],
        leak: tuple[int, int] | None = None,
        hidden: bool = False,
    ):
        """Feed `chunks` (sequence, tokens, position of its first token) packed in one row.

        Returns the output (logits [1, T, V]) and each chunk's slots. `leak=(seq, other)`: seq's
        query also attends other's earliest attended slot (a mask that lets a neighbour in).
        """
        slots = self._place(chunks)
        ids, positions, owners, mapping = [], [], [], []
        for (seq, tokens, start), mine in zip(chunks, slots):
            ids += tokens
            positions += range(start, start + len(tokens))
            owners += [seq] * len(tokens)
            mapping += mine
        mask = torch.full((1, 1, len(ids), self._width(len(ids))), NEG)
        for i, seq in enumerate(owners):
            own = self._view(seq) + [mapping[j] for j in range(i + 1) if owners[j] == seq]  # causal in its query
            if leak is not None and leak[0] == seq:
                own += self._view(leak[1])[:1]
            mask[0, 0, i, own] = 0.0
        if self.before is not None:
            self.before(chunks)
        fed = torch.tensor([ids])
        extra = {"inputs_embeds": self.model.get_input_embeddings()(fed)} if self.embeds else {"input_ids": fed}
        if self.flash:
            extra.update(self._varlen(chunks, mask))
            mask = mask == 0.0
        out = self.model(
            **extra,
            **self._where(mapping),
            position_ids=torch.tensor([positions]),
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=hidden,
        )
        self._commit(mapping, owners)
        return out, slots

    def _place(self, chunks) -> list[list[int]]:
        """Each chunk's new slots: appended after every slot so far."""
        slots, at = [], len(self.owner)
        for _, tokens, _ in chunks:
            slots.append(list(range(at, at + len(tokens))))
            at += len(tokens)
        return slots

    def _width(self, fed: int) -> int:
        return len(self.owner) + fed  # the keys: the cache so far plus this call's tokens

    def _view(self, seq: int) -> list[int]:
        return [j for j, owner in enumerate(self.owner) if owner == seq and self.live[j]]

    def _where(self, mapping: list[int]) -> dict:
        return {}  # an appended cache needs no slot mapping

    def _commit(self, mapping: list[int], owners: list[int]) -> None:
        self.owner += owners
        self.live += [True] * len(owners)

    def drop(self, slots: list[int], forget: bool = True) -> None:
        for j in slots:
            self.live[j] = False

    def release(self, seq: int) -> None:
        """A finished sequence: none of its slots is attended again."""
        self.drop([j for j, owner in enumerate(self.owner) if owner == seq])

    @staticmethod
    def _varlen(chunks, mask: torch.Tensor) -> dict:
        """Query and key offsets per sequence: its query tokens, and the keys its last one attends."""
        cu_q, cu_k, at = [0], [0], 0
        for _, tokens, _ in chunks:
            at += len(tokens)
            cu_q.append(at)
            cu_k.append(cu_k[-1] + int((mask[0, 0, at - 1] == 0.0).sum()))
        lengths_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
        lengths_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
        return {
            "cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32),
            "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32),
            "max_length_q": max(lengths_q),
            "max_length_k": max(lengths_k),
        }


def accepted(drafts: list[int], choices: list[int]) -> int:
    """Greedy acceptance: how many drafts agree with the target's argmax, in order."""
    a = 0
    while a < len(drafts) and drafts[a] == choices[a]:
        a += 1
    return a


class SlotPool:
    """A fixed pool of KV slots per layer, written where `slot_mapping` (a forward keyword the
    attention passes on) says; every call sees all of the pool's slots as keys."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, kwargs=None, **_):
        where = kwargs["slot_mapping"]
        if layer_idx not in self.keys:
            shape = (*keys.shape[:2], self.slots, keys.shape[3])
            self.keys[layer_idx], self.values[layer_idx] = keys.new_zeros(shape), values.new_zeros(shape)
        self.keys[layer_idx][:, :, where] = keys
        self.values[layer_idx][:, :, where] = values
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.slots


class SlotKV(SharedKV):
    """`SharedKV` over a `SlotPool`: `owner[j]` is the sequence slot j holds (None: free)."""

    def __init__(self, model, slots: int, embeds: bool = False, flash: bool = False) -> None:
        super().__init__(model, embeds, flash)
        self.cache = SlotPool(slots)
        self.owner = [None] * slots
        self.live = [False] * slots
        self.attends: dict[int, set[int]] = {}  # the slots each sequence's queries attend

    def _place(self, chunks) -> list[list[int]]:
        """Each chunk's new slots: the lowest free ones, in order."""
        free = [j for j, owner in enumerate(self.owner) if owner is None]
        need = sum(len(tokens) for _, tokens, _ in chunks)
        if need > len(free):
            raise RuntimeError(f"the KV pool is full: {need} slots wanted, {len(free)} free")
        slots, at = [], 0
        for _, tokens, _ in chunks:
            slots.append(free[at : at + len(tokens)])
            at += len(tokens)
        return slots

    def _width(self, fed: int) -> int:
        return self.cache.slots  # the keys: the whole pool

    def _view(self, seq: int) -> list[int]:
        return sorted(self.attends.get(seq, ()))

    def _where(self, mapping: list[int]) -> dict:
        return {"slot_mapping": torch.tensor(mapping)}

    def _commit(self, mapping: list[int], owners: list[int]) -> None:
        for j, seq in zip(mapping, owners):
            self.owner[j] = seq
            self.attends.setdefault(seq, set()).add(j)
        # The sequences of this call that attended a slot no longer theirs (reused or freed).
        self.foreign = [seq for seq in dict.fromkeys(owners) if any(self.owner[j] != seq for j in self.attends[seq])]

    def drop(self, slots: list[int], forget: bool = True) -> None:
        """Free the slots for reuse; `forget=False`: their old owner keeps attending them."""
        for j in slots:
            if forget:
                self.attends[self.owner[j]].discard(j)
            self.owner[j] = None

    def release(self, seq: int) -> None:
        self.drop([j for j, owner in enumerate(self.owner) if owner == seq])
