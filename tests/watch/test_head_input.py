"""`watch.headinput.HiddenTap`: the target's last hidden states (its LM head's input) of its
latest call, and which (row, column) holds the vector a head was fed. The oracle is the target's
base model run on the same ids (its last hidden state is the LM head's input)."""

from __future__ import annotations

import torch
from tiny import make_pair

from specviz.watch.headinput import HISTORY, HiddenTap


def test_tap_names_the_row_and_column_of_the_vector_fed() -> None:
    target = make_pair("llama").target
    ids = torch.tensor([[5, 9, 14, 3], [7, 7, 21, 30]])
    hidden = target.model(input_ids=ids).last_hidden_state  # independent of the tap
    tap = HiddenTap(target)
    try:
        fed = torch.stack([hidden[1, 3], hidden[0, 1], hidden[0, 3] + 0.5])[:, None]
        tap.start(ids.shape[1])
        target(input_ids=ids)
        tap.end()
        # (age, row, column): age 0 is the latest call; the shifted vector matches none
        assert tap.match_rows({"hidden_states": fed}, ()) == [[(0, 1, 3)], [(0, 0, 1)], []]
        target.lm_head(hidden + 1)  # outside a target call (a head sharing the LM head): not kept
        assert tap.match_rows({"hidden_states": fed}, ()) == [[(0, 1, 3)], [(0, 0, 1)], []]
        tap.start(ids.shape[1])  # logits_to_keep=1: the last column only, still named by its column
        target(input_ids=ids, logits_to_keep=1)
        tap.end()
        # The latest call kept the last column; the call before it (age 1) every column.
        assert tap.match_rows({"hidden_states": fed}, ()) == [[(0, 1, 3), (1, 1, 3)], [(1, 0, 1)], []]
        for _ in range(HISTORY - 1):  # calls whose LM head has not run keep nothing; the oldest ages out
            tap.start(ids.shape[1])
            tap.end()
        assert tap.match_rows({"hidden_states": fed}, ()) == [[(HISTORY - 1, 1, 3)], [], []]
        tap.start(ids.shape[1])
        tap.end()
        assert tap.match_rows({"hidden_states": fed}, ()) is None
    finally:
        tap.remove()


def test_a_head_in_half_precision_is_matched_in_it_and_to_its_own_row_only() -> None:
    """A head in fp16 on an fp32 trunk is fed the hidden states cast to fp16: compared in fp16 (one
    unit in its last place), it is found at its row and column, a bfloat16 head's likewise in
    bfloat16; a vector a few fp16 steps away on every feature is not."""
    target = make_pair("llama").target
    ids = torch.tensor([[5, 9, 14, 3], [7, 7, 21, 30]])
    tap = HiddenTap(target)
    try:
        tap.start(ids.shape[1])
        target(input_ids=ids)
        tap.end()
        hidden = tap.last
        half = hidden.half()
        nudged = half + (half.float().abs() * 4e-3 + 1e-3).half()  # past fp16's own rounding
        fed = torch.stack([half[1, 3], half[0, 1], nudged[0, 2]])[:, None]
        assert tap.match_rows({"hidden_states": fed}, ()) == [[(0, 1, 3)], [(0, 0, 1)], []]
        assert tap.match_rows({"hidden_states": hidden[:, -1:].bfloat16()}, ()) == [[(0, 0, 3)], [(0, 1, 3)]]
        # The same vectors fed in fp32 are held to RTOL: the fp16 copies are not the states.
        assert tap.match_rows({"hidden_states": fed.float()}, ()) == [[], [], []]
    finally:
        tap.remove()
