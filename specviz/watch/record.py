"""One captured forward call (`CallRecord`): what the hooks (`hooks.ModelHooks`) copied of what a
model was fed and returned, as device tensors until `materialize` turns them into lists at close,
where the call's batch map is read (`batchmap.read_map`) and kept with it."""

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
    # "2d" | "4d" (keys: cache then query) | "4d-slots" (keys: a static or in-place cache's slots)
    # | "none" (everything attended) | "unknown"
    mask_kind: str
    mask: Any  # may attend: 2d [B, W]; 4d [B, tail, W] (the last query rows); else None
    batch_size: int  # B
    query_len: int  # q
    argmax: Any = None  # [B, L]: argmax of the logits of the last L query slots
    # 4-D masks: [B, q], whether each query slot attends anything. A padded query slot attends
    # nothing (its row is all masked), so this is where a 4-D mask says which slots are padding.
    query_live: Any = None
    # False when the engine's token is not the argmax of these logits (declared to the watch: it
    # samples, or applies logits processors first): the argmax then never matches or judges a token.
    argmax_is_choice: bool = True
    started: float = 0.0
    ended: float = 0.0
    last_slots: list[int] | None = None  # [B]: each row's last attended query slot, set by `materialize`
    # [B]: what each row feeds and attends (`view.View`), set by `materialize`: the readers ask a
    # row's view, never the mask.
    views: list[Any] | None = None
    # What a packed call carries to say who is where (`batchmap`): one row holding several
    # sequences. `packed`: B == 1 and something may cut it (its mask and argmax kept whole).
    packed: bool = False
    cu_q: Any = None  # [S + 1] cu_seq_lens_q: query start of each sequence
    cu_k: Any = None  # [S + 1] cu_seq_lens_k: key start of each sequence in a shared KV
    query_lens: list[int] | None = None  # [S] declared with w.batch(..., query_lens=...)
    logit_slots: Any = None  # [L] query column of each kept argmax (logits_to_keep); None: the last L
    source: str | None = None  # the producer of its map (`batchmap.BatchMap.source`)
    contexts: list[int] | None = None  # [B] a packed call's rows: slots attended before the first query slot
    unreadable: str | None = None  # why no producer could map it (set by `materialize`)
    # A packed call's 4-D mask per query token: (attended count, drops a slot the token before it
    # attended, continues it: shares a slot with it and gains exactly one, attends exactly one slot
    # more), from `line_summary`.
    lines: list[tuple[int, bool, bool, bool]] | None = None
    # A packed call's rows: the key slots its first query token attends and those its last one
    # attends (what the sequence holds after the call). A sequence's slots stay its own in a shared
    # cache, so a row holds the sequence whose slots it mostly attends (`Follower._fits`).
    held: list[tuple[Any, Any]] | None = None  # [S] x ([keys] bool numpy, [keys] bool numpy)
    drafter: bool = False  # a draft head's call (`watch(..., drafter=head)`): fed hidden states, not ids
    # A head call's rows: the (age, target row, query column) of the recent target calls (age 0:
    # the latest) whose last hidden state each was fed (`headinput`); [] none matched; None: not
    # compared (the command: a dict by model index until `finish` keeps the target's).
    head_fed: list[list[tuple[int, int, int]]] | None = None
    # A head call made inside a target call (MTP-like: a module the target's forward calls on its
    # final hidden states): recorded after that call, its matches filled when the call ends.
    nested: bool = False
    segments: list[tuple[int, int, int]] | None = None  # a packed call's (row, start, length) per sequence
    # Tree verification (`tree`): per row its declared parents (w.batch(..., parents=...)); after
    # `materialize`, `trees` holds each row's tree (declared, or read from the mask; None: a chain).
    parents: list[list[int]] | None = None
    # What `w.batch(drafts=, chunk=)` said of each declared sequence: (its drafts, a prefill chunk).
    declared: tuple[tuple[int | None, bool], ...] | None = None
    map: Any = None  # the `BatchMap` read at `materialize`, one segment per row of the record
    trees: list[list[int] | None] | None = None
    tree_source: str | None = None  # "declared" | "mask"
    # A packed call's query columns that are tree nodes where the block-diagonal rule would cut
    # (`tree.packed_nodes`): the call packs trees, each read inside its sequence's segment.
    tree_nodes: list[int] | None = None
    # A call that packs trees over keys [cache | query] (a shared cache that only appends): the
    # key column of each row's first query token, and the call's last key + 1, so the next call's
    # view names which node slots it still attends (`tree.kept_nodes`).
    node_keys: list[int] | None = None
    keys_end: int | None = None

    def materialize(self) -> None:
        """Tensors to lists, once, at close: the only host syncs the watch adds. Then the call's
        batch map (`batchmap`): a packed call becomes one row per sequence."""
        if self.last_slots is not None:
            return
        from specviz.watch import batchmap, tree

        self._to_lists("input_ids", "positions", "argmax", "query_live", "cu_q", "cu_k", "logit_slots")
        whole = self._packed_row()
        # Trees packed in the call (read from its mask, or declared: a call fed no mask, cut by
        # cu_seq_lens, has only its declaration to say them): each segment's tree is read.
        trees = bool(self.tree_nodes) or self.parents is not None
        self._to_lists("mask")
        base = self.cache_width
        self.map, packed = batchmap.read_map(self), False
        if self.map.readable:  # a packed call's rows keep the slots each token attends where it packs trees
            packed = batchmap.apply(self, self.map, whole if trees else None)
        else:  # what the producer said, not what an earlier reading said
            self.unreadable = self.map.unreadable
        if whole is not None:
            self._keep_row(whole, packed, trees, base)
        self.last_slots = [self.view(row).last for row in range(self.batch_size)]
        if not packed or trees:
            tree.read_trees(self)
        if self.logit_slots is not None and self.argmax is not None:  # (`apply` spread a packed call's)
            # Argmax kept at some columns only: spread over the query, None elsewhere (`argmax_at`).
            kept = batchmap.argmax_by_column(self)
            self.argmax = [[kept.get((r, c)) for c in range(self.query_len)] for r in range(len(self.argmax))]
            self.logit_slots = None

    def _packed_row(self) -> Any:
        """The [T, keys] mask tensor of a packed row, read as a summary per query token (`lines`)
        and its tree nodes (`tree.packed_nodes`); None for any other call. One row verifying a tree
        (declared, or read from its mask: `tree.one_tree`) packs no sequences."""
        from specviz.watch import tree

        if not self.packed or self.mask_kind == "2d" or not isinstance(self.mask, torch.Tensor):
            return None
        declared = self.parents is not None and self.query_lens is None
        self.packed = not declared and not tree.one_tree(self.mask[0], self.cache_width, self.positions[0])
        if not self.packed:
            return None
        whole = self.mask[0]
        self.lines, self.mask = line_summary(whole), None
        if self.query_live is None:  # the slots that attend anything: those that count any
            self.query_live = [[line[0] > 0 for line in self.lines]]
        self.tree_nodes = tree.packed_nodes(whole, self.lines, self.positions[0])
        if whole.shape[-1] == self.cache_width + self.query_len:  # keys [cache | query]
            self.keys_end = self.cache_width + self.query_len
        return whole

    def _keep_row(self, whole: Any, packed: bool, trees: bool, base: int) -> None:
        """What a packed row keeps once its map is applied: each sequence's first and last view
        (`held`) and, packing trees, its node keys; one sequence after all: its 4-D mask."""
        if not packed:  # read as any 4-D mask
            self.mask = [whole.tolist()]
            return
        self.held = segment_slots(whole, self.segments)
        if trees and self.keys_end is not None:
            self.node_keys = [base + start for _, start, _ in self.segments]

    def _to_lists(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.tolist())

    def mark_unreadable(self, why: str) -> None:
        """Say why no step can be read from this call on: the first reason stands (what the map's
        producer said, else the earliest later reading that could not go on)."""
        if self.unreadable is None:
            self.unreadable = why

    def cache_of(self, row: int) -> int:
        """Slots in the row's cache before the call (a packed call's rows each have their own)."""
        return self.contexts[row] if self.contexts is not None else self.cache_width

    def query_flags(self, row: int) -> list[int]:
        """1 for each query slot of `row` that is attended (a real token), 0 for padding. Shared:
        callers read it, never change it."""
        return self.view(row).flags

    def view(self, row: int) -> Any:
        """What the row feeds and attends (`view.View`): read once from the mask, at the first ask
        after `materialize` (`batchmap.apply` gives a packed call's segments theirs)."""
        if self.views is None:
            from specviz.watch.view import read_views

            self.views = read_views(self)
        return self.views[row]
