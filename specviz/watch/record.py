"""One captured forward call (`CallRecord`): what the hooks copied of what a model was fed and
returned, as device tensors until `materialize` turns them into lists and reads its batch map."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specviz.watch.tensor_reads import line_summary, segment_slots


@dataclass
class CallRecord:
    """One forward call of one watched model; tensors until `materialize`, lists after."""

    role: str  # "target" | "draft"
    rows: tuple[int, ...] | None  # sequence held by each row at call time (None: the default order)
    input_ids: Any  # [B, q]
    positions: Any  # [B, q] fed, or derived by the model's own rule
    positions_fed: bool
    cache_width: int
    mask_kind: str  # "2d" | "4d" (keys [cache | query]) | "4d-slots" (a static cache's) | "none" | "unknown"
    mask: Any  # may attend: 2d [B, W]; 4d [B, tail, W] (the last query rows); a packed row's whole; else None
    batch_size: int  # B
    query_len: int  # q
    argmax: Any = None  # [B, L]: argmax of the logits of the last L query slots
    query_live: Any = None  # 4-D masks: [B, q], whether each query slot attends anything (else padding)
    argmax_is_choice: bool = True  # False: the engine samples, or processes the logits first
    started: float = 0.0
    ended: float = 0.0
    last_slots: list[int] | None = None  # [B]: each row's last attended query slot (`materialize`)
    views: list[Any] | None = None  # [B]: what each row feeds and attends (`view.View`), read at `materialize`
    packed: bool = False  # B == 1 and something may cut it (`batchmap`): its mask and argmax kept whole
    cu_q: Any = None  # [S + 1] cu_seq_lens_q: query start of each sequence
    cu_k: Any = None  # [S + 1] cu_seq_lens_k: key start of each sequence in a shared KV
    query_lens: list[int] | None = None  # [S] declared with w.batch(..., query_lens=...)
    logit_slots: Any = None  # [L] query column of each kept argmax (logits_to_keep); None: the last L
    unreadable: str | None = None  # why no producer could map it (set by `materialize`)
    lines: list[tuple[int, bool, bool, bool]] | None = None  # a packed mask per query token (`line_summary`)
    held: list[tuple[Any, Any]] | None = None  # [S] key slots of each packed row's first and last token (numpy)
    drafter: bool = False  # a draft head's call (`watch(..., drafter=head)`): fed hidden states, not ids
    head_fed: list[list[tuple[int, int, int]]] | None = None  # `headinput.Matches`; None: not compared
    nested: bool = False  # a head call made inside a target call (MTP-like): recorded after it
    segments: list[tuple[int, int, int]] | None = None  # a packed call's (row, start, length) per sequence
    parents: list[list[int]] | None = None  # per row its declared tree (w.batch(..., parents=...))
    declared: tuple[tuple[int | None, bool], ...] | None = None  # w.batch(drafts=, chunk=) per sequence
    map: Any = None  # the `BatchMap` read at `materialize`, one segment per row of the record
    trees: list[list[int] | None] | None = None  # [B] each row's tree after `materialize` (None: a chain)
    tree_nodes: list[int] | tuple[()] = ()  # a packed call's tree-node columns (`tree.packed_nodes`)
    node_keys: list[int] | None = None  # trees packed over keys [cache | query]: each row's first query key
    keys_end: int | None = None  # and the call's last key + 1: which node slots the next call attends (`tree`)
    fed_rows: dict[tuple[int, int | None], list[int]] | None = None  # a draft call's rows by (fed, argmax)
    keys0: Any = None  # [B, H, cache_width, D] the cache's layer-0 keys before a target's padded call (`content`)
    cache_id: int | None = None  # the cache object fed, as a serial (`hooks.CacheSerials`); None: none

    def materialize(self) -> None:
        """Tensors to lists, once, at close (the only host syncs the watch adds); then the call's
        batch map (`batchmap`): a packed call becomes one row per sequence."""
        if self.last_slots is not None:
            return
        from specviz.watch import batchmap, tree, view

        self._to_lists("input_ids", "positions", "argmax", "query_live", "cu_q", "cu_k", "logit_slots")
        whole = self._packed_row()
        # Trees packed in the call, read from its mask or declared (a call fed no mask, cut by
        # cu_seq_lens, has only its declaration to say them): a row keeps the slots each token attends.
        trees = bool(self.tree_nodes) or self.parents is not None
        base, self.map = self.cache_width, batchmap.read_map(self)
        if not self.map.readable:  # what the producer said, not what an earlier reading said
            self.unreadable = self.map.unreadable
        elif batchmap.apply(self, self.map, whole if trees else None) and whole is not None:
            self.held = segment_slots(whole, self.segments)  # each sequence's first and last key slots
            if trees and self.keys_end is not None:
                self.node_keys = [base + start for _, start, _ in self.segments]
        self._to_lists("mask")  # a packed row not cut after all keeps its 4-D mask
        if self.views is None:  # (a packed call's segments were given theirs by `batchmap.apply`)
            self.views = view.read_views(self)
        self.last_slots = [v.last for v in self.views]
        tree.read_trees(self)  # a packed call's rows show no tree unless it packs trees (`Slotted`)
        if self.logit_slots is not None:  # argmax kept at some columns: spread, None elsewhere
            self.argmax, self.logit_slots = batchmap.spread_argmax(self), None

    def _packed_row(self) -> Any:
        """A packed row's [T, keys] mask, its `lines` and tree nodes read; None for any other call, and
        for one row verifying a tree (declared, or read from its mask: `tree.one_tree`)."""
        from specviz.watch import tree

        if not self.packed or self.mask_kind not in ("4d", "4d-slots"):  # the hooks keep these whole
            return None
        whole = self.mask[0].cpu().numpy()  # one transfer: every reading of it below is numpy's
        declared = self.parents is not None and self.query_lens is None
        self.packed = not declared and not tree.one_tree(whole, self.cache_width, self.positions[0])
        if not self.packed:
            return None
        self.lines = line_summary(torch.from_numpy(whole))  # the host copy: no second transfer
        # The hooks keep no live list of a packed row: its live slots are those that attend any.
        self.query_live = [[line[0] > 0 for line in self.lines]]
        self.tree_nodes = tree.packed_nodes(whole, self.lines, self.positions[0])
        if whole.shape[-1] == self.cache_width + self.query_len:  # keys [cache | query]
            self.keys_end = self.cache_width + self.query_len
        return whole

    def _to_lists(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.tolist())

    @property
    def seq_ids(self) -> tuple[int, ...]:
        """The sequence each row held (the default order where the rows said are none, or another number)."""
        return (
            self.rows if self.rows is not None and len(self.rows) == self.batch_size else tuple(range(self.batch_size))
        )

    def mark_unreadable(self, why: str) -> None:
        """Say why no step can be read from this call on; the first reason stands."""
        if self.unreadable is None:
            self.unreadable = why
