"""Which row of a verify call produced each sequence's tokens, and what it accepted: its own row where
they fit its drafts and the target's choices, else the row they fit (a write-back to the wrong
sequence shows as `write_seq != seq_id`), split where one sequence got several rows' tokens."""

from __future__ import annotations

from typing import Any

from specviz.watch import tree
from specviz.watch.attribution import Group
from specviz.watch.calls import RowQuery, argmax_at, row_seq_ids, tree_of
from specviz.watch.record import CallRecord


def consistent(tokens: list[int], drafts: list[int], targets: list[int], free_last: bool = False) -> bool:
    """Tokens read as some drafts, then (optionally) one more: the target's own token at that slot,
    or any token when the argmax is not the engine's choice (`free_last`: a sample, or a choice
    made on processed logits)."""
    n = _agree(tokens, drafts)
    rest = tokens[n:]  # after the drafts they repeat: nothing, or the one token the target chose
    return rest in ([], targets[n : n + 1]) or free_last and len(rest) == 1


def _agree(a: list[int], b: list[int]) -> int:
    """How many leading items `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def matched_prefix(drafts: list[int], targets: list[int]) -> int | None:
    """The drafts the target agrees with, None unless it chose one token per draft and one more."""
    return _agree(drafts, targets) if len(targets) == len(drafts) + 1 else None


def accepted_and_bonus(tokens: list[int], drafts: list[int], targets: list[int]) -> tuple[int, int | None]:
    """(accepted, bonus) as the emitted tokens show them: a prefix of the greedy-correct output
    accepts what verification allowed (emitting fewer is speed lost, not a wrong answer), else the
    drafts emitted."""
    matched = matched_prefix(drafts, targets)
    greedy = matched is not None and tokens == (drafts[:matched] + [targets[matched]])[: len(tokens)]
    accepted = matched if greedy else _agree(tokens, drafts)
    return accepted, tokens[accepted] if len(tokens) == accepted + 1 else None


def assign_rows(call: CallRecord, groups: list[Group], shown: list[RowQuery], running: set[int]) -> dict[int, Group]:
    """Which row produced each group: its own if consistent, else a `running` sequence's row it is
    consistent with (each row read as `shown`)."""
    rows = row_seq_ids(call)
    free_last = not call.argmax_is_choice

    def fits(group: Group, r: int) -> bool:
        drafts, targets = row_tokens(call, r, shown[r])
        parents = tree_of(call, r)
        if parents is not None:  # a path of the row's tree, then its choice there
            nodes = [call.input_ids[r][shown[r].pending], *drafts]
            return tree.consistent(group.tokens, parents, nodes, targets, free_last)
        return consistent(group.tokens, drafts, targets, free_last)

    taken: dict[int, Group] = {}

    def place(group: Group) -> bool:
        own = rows.index(group.seq_id)
        if own not in taken and fits(group, own):
            taken[own] = group
            return True
        return False

    # A late group (emitted after a newer call of its sequence: maybe that call's tokens, matched
    # here by its pending token) places after the on-time groups have been read, split included.
    # An on-time group that missed its own row tries it again in vain (still taken, or unfit).
    unfit = []
    for group in [g for g in groups if not g.late and not place(g)] + [g for g in groups if g.late]:
        if place(group):
            continue
        free = {r for r in range(len(rows)) if r not in taken and rows[r] in running}
        pieces = _split_to_rows(group, free, rows.index(group.seq_id), fits)
        if pieces is None:
            unfit.append(group)
            continue
        pieces[-1][1].finish_reason = group.finish_reason  # the group's ending is its last piece's
        taken.update(pieces)
    for group in unfit:  # fits no row, whole or split: its own row shows what it got
        taken.setdefault(rows.index(group.seq_id), group)
    return taken


def _split_to_rows(group: Group, free: set[int], own: int, fits: Any) -> list[tuple[int, Group]] | None:
    """The group as consecutive pieces, cut where its emits were appended, each fitting a distinct
    free row (its own first), longest first: e.g. one row's tokens written to another's sequence
    before that row's own. None when no split fits; no piece carries the group's ending."""
    bounds = [0, *group.cuts, len(group.tokens)]

    def search(a: int, free_rows: set[int]) -> list[tuple[int, Group]] | None:
        if a == len(bounds) - 1:
            return []
        for b in range(len(bounds) - 1, a, -1):  # the longest piece first
            candidate = Group(group.seq_id, group.tokens[bounds[a] : bounds[b]], None, group.call, group.at)
            for r in sorted(free_rows, key=lambda r: (r != own, r)):  # its own row first, then in order
                if fits(candidate, r):
                    rest = search(b, free_rows - {r})
                    if rest is not None:
                        return [(r, candidate), *rest]
        return None

    return search(0, free)  # never empty: at least one piece


def row_tokens(call: CallRecord, row: int, rq: RowQuery) -> tuple[list[int], list[int]]:
    """(the row's d drafts, the target's argmax at its d + 1 query slots, or [] if not kept)."""
    drafts = list(call.input_ids[row][rq.pending + 1 : rq.pending + 1 + rq.drafts])
    targets = [argmax_at(call, row, rq.pending + i) for i in range(rq.drafts + 1)]
    return drafts, ([] if None in targets else targets)
