"""What `ModelHooks` keeps of one forward (`specviz/watch/hooks.py`; docs/watch-heads.md, "What a
forward keeps"), on a model written by hand whose every logit is known: the argmax of query column
t of a row is its id + 1, so the kept argmax says which columns were kept.

Per call: the cache width of the older tuple cache, the positions the model derives from a
`cache_position` or a broadcast `position_ids` (OPT's from its mask's ones), a 4-D mask over
[cache | query] keys and which of its query slots are real (a slot that does not attend its own
key feeds nothing), a target fed `inputs_embeds` read as the ids whose embedding rows they are (-1
where none is), a long packed row's argmax kept at the last slots before each place a sequence may
end, no argmax where the output holds no [B, T, V] logits, and a draft head's call (fed hidden
states) read from its first tensor of two dimensions or more."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from watch_calls import recorded

import specviz
from specviz.watch import WatchError
from specviz.watch.hooks import cache_width

VOCAB = 400


class HandLM(torch.nn.Module):
    """A causal LM by hand: logits one-hot at id + 1 (mod VOCAB) per query column; fed embeddings,
    at the table row nearest by distance plus 1."""

    def __init__(self, table: torch.Tensor | None = None, flat: bool = False) -> None:
        super().__init__()
        table = torch.randn(VOCAB, 4, generator=torch.Generator().manual_seed(0)) if table is None else table
        self.embed = torch.nn.Embedding.from_pretrained(table, freeze=True)
        self.head = torch.nn.Linear(table.shape[1], table.shape[0], bias=False)
        self.flat = flat  # return the last column's logits only, [B, V]

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        cache_position=None,
        inputs_embeds=None,
        cu_seq_lens_q=None,
        logits_to_keep=None,
    ) -> torch.Tensor:
        if input_ids is None:
            input_ids = torch.cdist(inputs_embeds, self.embed.weight[None]).argmin(-1)
        vocab = self.embed.weight.shape[0]
        logits = torch.nn.functional.one_hot((input_ids + 1) % vocab, vocab).float()
        return logits[:, -1] if self.flat else logits


class Head(torch.nn.Module):
    """A draft head fed a step number first, then hidden states: logits one-hot at 3."""

    def forward(self, step, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.full(hidden_states.shape[:-1], 3), VOCAB).float()


class Width:
    """A cache that counts its slots (as HF's `Cache.get_seq_length`)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_seq_length(self) -> int:
        return self.n


def test_a_watch_of_something_not_a_torch_module_says_so() -> None:
    with pytest.raises(WatchError, match="target is a str, not a torch module; pass the model itself"):
        specviz.watch("tiny-llama")


def test_the_older_tuple_cache_is_as_wide_as_its_keys() -> None:
    """`past_key_values` as a tuple of (key, value) per layer: its width is the keys' length."""
    keys = torch.zeros(2, 1, 5, 4)  # [batch, heads, slots, head dim]
    layer = (keys, keys)
    assert cache_width((layer, layer)) == 5
    assert cache_width(None) == 0 and cache_width(()) == 0 and cache_width(Width(7)) == 7
    (call,), _ = recorded(HandLM(), input_ids=torch.tensor([[5, 6], [7, 8]]), past_key_values=(layer, layer))
    assert call.cache_width == 5
    assert call.positions == [[5, 6], [5, 6]] and not call.positions_fed  # the model's own rule: after the cache


def test_a_cache_position_or_a_broadcast_position_row_gives_every_row_its_positions() -> None:
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    (call,), _ = recorded(HandLM(), input_ids=ids, cache_position=torch.arange(4, 7), past_key_values=Width(4))
    assert call.positions.tolist() == [[4, 5, 6], [4, 5, 6]] and not call.positions_fed
    (call,), _ = recorded(HandLM(), input_ids=ids, position_ids=torch.tensor([[2, 3, 4]]), past_key_values=Width(4))
    assert call.positions.tolist() == [[2, 3, 4], [2, 3, 4]] and call.positions_fed
    assert call.argmax.tolist() == [[6, 7, 8], [9, 10, 11]]


def test_a_4d_mask_over_cache_and_query_keys_marks_a_slot_that_misses_its_own_key_as_padding() -> None:
    """Keys [cache of 4 | query of 3]. Row 1's last query slot (a finished row fed a pad) attends
    the cache and row 1's earlier query slots but not its own key: it feeds nothing."""
    causal = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    mask = torch.ones(2, 1, 3, 7, dtype=torch.bool)
    mask[:, 0, :, 4:] = causal
    mask[1, 0, 2, 6] = False
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    (call,), _ = recorded(HandLM(), input_ids=ids, attention_mask=mask, past_key_values=Width(4))
    assert call.mask_kind == "4d"
    assert call.query_live.tolist() == [[True, True, True], [True, True, False]]
    # Keys that are not [cache | query] (8 slots of a static cache): read by counts, every slot that
    # attends anything live.
    slots = torch.zeros(2, 1, 3, 8, dtype=torch.bool)
    slots[:, 0, :, :4] = True
    slots[:, 0, :, 4:7] = causal
    (call,), _ = recorded(HandLM(), input_ids=ids, attention_mask=slots, past_key_values=Width(4))
    assert call.mask_kind == "4d-slots"
    assert call.query_live.tolist() == [[True, True, True], [True, True, True]]


def test_embeddings_fed_read_as_the_ids_of_their_rows_and_minus_one_elsewhere() -> None:
    """Rows chosen so that only each vector's own direction picks its row: a vector far from the
    origin along one axis (row 0), the diagonal (row 1), and the middle of rows 0 and 1 (no row)."""
    table = torch.tensor([[10.0, 0.1], [1.0, 1.0], [-1.0, 2.0], [0.5, -3.0]])
    model = HandLM(table)
    embeds = torch.stack([table[0], table[1], (table[0] + table[1]) / 2, table[3]])[None]
    (call,), _ = recorded(model, inputs_embeds=embeds)
    assert call.input_ids.tolist() == [[0, 1, -1, 3]]
    (call,), _ = recorded(model, inputs_embeds=torch.stack([table[:2], table[2:]]))  # two rows
    assert call.input_ids.tolist() == [[0, 1], [2, 3]]


def test_a_long_packed_row_keeps_the_argmax_of_the_last_slots_before_each_end() -> None:
    """One row of 150 query tokens packing two sequences (100 and 50): the argmax is kept for the
    16 slots before each end, cut by `cu_seq_lens_q` or by the mask (the first token of the second
    sequence drops the slots of the first); with neither, every column."""
    ids = torch.arange(150)[None] % 300
    ends = [*range(84, 100), *range(134, 150)]
    (call,), _ = recorded(HandLM(), input_ids=ids, cu_seq_lens_q=torch.tensor([0, 100, 150]))
    assert call.logit_slots.tolist() == ends
    assert call.argmax.tolist() == [[c + 1 for c in ends]]
    mask = torch.zeros(1, 1, 150, 150, dtype=torch.bool)
    mask[0, 0, :100, :100] = torch.ones(100, 100).tril().bool()
    mask[0, 0, 100:, 100:] = torch.ones(50, 50).tril().bool()
    (call,), _ = recorded(HandLM(), input_ids=ids, attention_mask=mask)
    assert call.logit_slots.tolist() == ends
    assert call.argmax.tolist() == [[c + 1 for c in ends]]
    (call,), _ = recorded(HandLM(), input_ids=ids)
    assert call.logit_slots.tolist() == list(range(150))
    # A first sequence of 10 tokens: its slots from the row's start, none before it.
    (call,), _ = recorded(HandLM(), input_ids=ids, cu_seq_lens_q=torch.tensor([0, 10, 150]))
    assert call.logit_slots.tolist() == [*range(10), *range(134, 150)]


def test_a_head_call_is_read_from_its_first_tensor_of_two_dimensions_or_more() -> None:
    """A head fed (a step number, hidden states [2 rows, 3 slots, H]): a call of 2 rows of 3 slots.
    Fed no tensor of two dimensions or more, it is not recorded (and the engine's call goes on)."""
    (call,), _ = recorded(Head(), 0, torch.zeros(2, 3, 4), drafter=True)
    assert (call.role, call.drafter, call.batch_size, call.query_len) == ("draft", True, 2, 3)
    assert not call.positions_fed  # fed hidden states: no positions
    assert call.argmax.tolist() == [[3, 3, 3], [3, 3, 3]]
    (call,), _ = recorded(Head(), 0, torch.zeros(2, 4), drafter=True)  # [rows, H]: one slot each
    assert (call.batch_size, call.query_len) == (2, 1)
    calls, out = recorded(Head(), 0, torch.zeros(4), drafter=True)
    assert calls == [] and out.shape == (VOCAB,)


def test_opt_counts_the_masks_ones_for_positions_it_derives() -> None:
    """An OPT model fed no positions derives them from its 2-D mask: each token's count of ones
    before it (a left pad reads -1)."""
    model = HandLM()
    model.config = SimpleNamespace(model_type="opt")
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    (call,), _ = recorded(model, input_ids=torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]]), attention_mask=mask)
    assert call.positions.tolist() == [[-1, 0, 1, 2], [0, 1, 2, 3]] and not call.positions_fed
    # A step over a cache of 4: the last query column of the mask's count.
    step = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    (call,), _ = recorded(model, input_ids=torch.tensor([[40], [41]]), attention_mask=step, past_key_values=Width(4))
    assert call.positions.tolist() == [[3], [4]]


def test_a_call_whose_output_has_no_logits_keeps_no_argmax_and_no_columns() -> None:
    """`logits_to_keep` fed as columns, but the output is [B, V], not [B, T, V]: nothing kept."""
    (call,), _ = recorded(HandLM(flat=True), input_ids=torch.tensor([[5, 6, 7]]), logits_to_keep=torch.tensor([2]))
    assert call.argmax is None and call.logit_slots is None
