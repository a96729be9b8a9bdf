"""`watch.headinput.HiddenTap` for a head called inside the target's call (MTP-like), fed every
query slot: each of a 16-slot verify (a pending token and 15 drafts) may be the accepted one whose
state proposes the next draft, so all 16 are matched, at the end of the target's call; and a target
whose LM head is not an `nn.Linear` (no `in_features`), whose states' width is read from the
states it keeps. The oracle is the target's base model run on the same ids (its last hidden state
is the LM head's input)."""

from __future__ import annotations

import torch
from tiny import make_pair

from specviz.watch.headinput import HiddenTap


def test_a_head_inside_the_call_is_matched_at_every_slot_of_a_sixteen_slot_verify() -> None:
    target = make_pair("llama").target
    ids = torch.tensor([[5 + (7 * t) % 80 for t in range(16)]])  # pending + 15 drafts
    hidden = target.model(input_ids=ids).last_hidden_state  # independent of the tap
    tap = HiddenTap(target)
    try:
        tap.start(ids.shape[1])
        target(input_ids=ids)
        found = tap.match_rows({"hidden_states": hidden}, ())  # inside the open call: filled at its end
        assert found == [[]]
        tap.end()
    finally:
        tap.remove()
    assert found == [[(0, 0, column) for column in range(16)]]


class TiedHead(torch.nn.Module):
    """An LM head that is not an `nn.Linear`: the embedding table, transposed (no `in_features`)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T


def test_a_target_whose_lm_head_says_no_width_is_matched_by_the_states_it_kept() -> None:
    target = make_pair("llama").target
    target.lm_head = TiedHead(target.get_input_embeddings().weight)
    ids = torch.tensor([[5, 9, 14], [7, 8, 21]])
    hidden = target.model(input_ids=ids).last_hidden_state
    tap = HiddenTap(target)
    try:
        tap.start(ids.shape[1])
        target(input_ids=ids)
        tap.end()
        assert tap.match_rows({"hidden_states": hidden[:, -1:]}, ()) == [[(0, 0, 2)], [(0, 1, 2)]]
    finally:
        tap.remove()
