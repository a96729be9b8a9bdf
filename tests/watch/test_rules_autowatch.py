"""The command's watcher (`specviz/watch/autowatch.py`) by hand: a head named by `--drafter` that
lives inside the target (MTP-like) is found beside a draft model, one called before any causal LM
was built is found too, and `unpadded_prompts` strips the left padding of a first call fed no mask
only where the batch shows it is padding."""

from __future__ import annotations

import pytest
import torch
from tiny import build

from specviz.watch.autowatch import AutoWatch, unpadded_prompts
from specviz.watch.record import CallRecord

PAD = 0


class InsideHead(torch.nn.Module):
    """A head that is a submodule of the target and returns the target's logits (MTP-like); with
    `pair`, as the first of (logits, features)."""

    def __init__(self, target: torch.nn.Module, pair: bool = False) -> None:
        super().__init__()
        hidden = target.config.hidden_size
        self.proj = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Linear(hidden, target.config.vocab_size, bias=False)
        self.pair = pair

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        features = self.proj(hidden_states)
        return (self.out(features), features) if self.pair else self.out(features)


@pytest.mark.parametrize(
    ("pair", "fed"), [(False, (1, 1, 64)), (True, (1, 1, 64)), (False, (1, 64))], ids=["logits", "pair", "2d"]
)
def test_a_head_inside_the_target_is_found_beside_a_draft_model(pair: bool, fed: tuple[int, ...]) -> None:
    """Two causal LMs ran (a target and a draft); the named class is a submodule of the target
    returning logits of its vocabulary ([B, T, V] or [B, V], alone or first of a tuple): it is the
    head, though the draft does not hold it."""
    target, draft = build("llama", 2, 64), build("llama", 1, 64)
    target.mtp = InsideHead(target, pair)
    watcher = AutoWatch(drafter="InsideHead")
    watcher.install()
    try:
        watcher.adopt(target)
        watcher.adopt(draft)
        ids = torch.tensor([[5, 6, 7]])
        with torch.no_grad():
            target(ids)
            draft(ids)
            target.mtp(torch.zeros(fed))
    finally:
        watcher.uninstall()
    assert watcher.head is target.mtp


def test_a_head_called_before_any_causal_lm_is_found() -> None:
    """The named class called while no causal LM was built yet: it is outside them all, the head."""
    target = build("llama", 1, 64)
    head = InsideHead(target)
    watcher = AutoWatch(drafter="InsideHead")
    watcher.install()
    try:
        with torch.no_grad():
            head(torch.zeros(1, 1, 64))
    finally:
        watcher.uninstall()
    assert watcher.head is head


def first_call(ids: list[list[int]], mask: list[list[int]] | None) -> CallRecord:
    """A prefill with no cache, fed a 2-D mask or none, materialized (as `infer` leaves it)."""
    q = len(ids[0])
    call = CallRecord(
        role="target", rows=None, input_ids=ids, positions=[list(range(q)) for _ in ids], positions_fed=False,
        cache_width=0, mask_kind="2d" if mask else "none", mask=mask, batch_size=len(ids), query_len=q,
        argmax=[[40] for _ in ids],
    )  # fmt: skip
    call.materialize()
    return call


def test_a_first_call_fed_no_mask_loses_its_left_padding() -> None:
    """A rectangular batch, rows starting with pad runs of different lengths, one none: padding.
    A prompt that joined later (beyond the first call's rows) is kept as read."""
    ids = [[PAD, PAD, 5, 6], [7, 8, 9, 10], [PAD, 11, 12, 13]]
    read = [list(r) for r in ids] + [[PAD, 20]]
    assert unpadded_prompts(read, [first_call(ids, None)], PAD) == [[5, 6], [7, 8, 9, 10], [11, 12, 13], [PAD, 20]]


def test_pad_ids_that_need_not_be_padding_are_kept() -> None:
    # Every row starts with the pad id: it may be each prompt's own first token.
    ids = [[PAD, PAD, 5], [PAD, 7, 8]]
    assert unpadded_prompts([list(r) for r in ids], [first_call(ids, None)], PAD) == ids
    # No row starts with it: nothing to strip.
    ids = [[4, PAD, 5], [6, 7, 8]]
    assert unpadded_prompts([list(r) for r in ids], [first_call(ids, None)], PAD) == ids
    # The engine has no pad id.
    ids = [[PAD, PAD, 5], [6, 7, 8]]
    assert unpadded_prompts([list(r) for r in ids], [first_call(ids, None)], None) == ids


def test_prompts_read_through_a_mask_or_of_unequal_lengths_are_kept() -> None:
    """A masked call's prompts were read from what each row attends: a leading pad id there is a
    token of the prompt. Prompts of unequal lengths are no rectangular batch's rows."""
    ids = [[PAD, PAD, 5, 6], [7, 8, 9, 10]]
    masked = first_call(ids, [[1, 1, 1, 1], [1, 1, 1, 1]])
    assert unpadded_prompts([list(r) for r in ids], [masked], PAD) == ids
    unequal = [[PAD, 5], [7, 8, 9]]
    assert unpadded_prompts(unequal, [first_call(ids, None)], PAD) == unequal
