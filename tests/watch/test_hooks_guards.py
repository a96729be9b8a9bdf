"""The inputs `ModelHooks` reads as nothing, or refuses (`specviz/watch/hooks.py`): branches no
engine of the zoo reaches, each kept for an input a user or a real engine can give, pinned here on
a model written by hand that takes ids, embeddings of any width, or neither."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from watch_calls import recorded

from specviz.watch import WatchError
from specviz.watch.hooks import cache_width, check_causal_lm
from specviz.watch.tensor_reads import QUERY_TAIL

VOCAB = 50


class Loose(torch.nn.Module):
    """A causal LM by hand: logits one-hot at id + 1 (zeros when fed no ids), for any input width."""

    def __init__(self, table: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 4)
        self.head = torch.nn.Linear(4, VOCAB)
        self.table = table

    def get_input_embeddings(self) -> torch.nn.Module | None:
        return self.embed if self.table else None

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids=None, inputs_embeds=None, hidden_states=None) -> torch.Tensor:
        if input_ids is not None:
            return torch.nn.functional.one_hot((input_ids + 1) % VOCAB, VOCAB).float()
        fed = inputs_embeds if inputs_embeds is not None else hidden_states
        return torch.zeros(*fed.shape[:-1], VOCAB)


def test_an_encoder_decoder_model_is_refused() -> None:
    model = Loose()
    model.config = SimpleNamespace(is_encoder_decoder=True)
    with pytest.raises(WatchError, match=r"target \(Loose\) is an encoder-decoder model, not a causal LM"):
        check_causal_lm(model, "target")


def test_a_cache_that_cannot_count_its_slots_is_as_wide_as_no_cache() -> None:
    """transformers' paged cache has `get_seq_length` but cannot answer it: its keys are read from
    the mask."""

    class Paged:
        def get_seq_length(self) -> int:
            raise NotImplementedError

    assert cache_width(Paged()) == 0


def test_a_call_fed_no_ids_it_can_read_is_not_recorded() -> None:
    """Fed hidden states by another name (neither ids nor embeddings), 1-D ids, embeddings of
    another width than the table's, or embeddings by a model with no table: nothing to attribute,
    and the engine's call goes on. Embeddings of the table's own rows are read as their ids."""
    model = Loose()
    assert recorded(model, hidden_states=torch.zeros(2, 3, 8))[0] == []
    assert recorded(model, input_ids=torch.tensor([5, 6]))[0] == []
    assert recorded(model, inputs_embeds=torch.zeros(1, 2, 3))[0] == []
    rows = model.embed.weight.detach()[None, :2]
    assert recorded(Loose(table=False), inputs_embeds=rows)[0] == []
    (call,), _ = recorded(model, inputs_embeds=rows)
    assert call.input_ids.tolist() == [[0, 1]]


def test_a_long_batch_keeps_the_argmax_of_its_last_query_tail_columns() -> None:
    """Two rows of QUERY_TAIL + 10 query tokens (a batched prefill) are no packed row: the argmax is
    kept for the last QUERY_TAIL columns, with no column list."""
    q = QUERY_TAIL + 10
    ids = torch.arange(2 * q).reshape(2, q) % VOCAB
    (call,), _ = recorded(Loose(), input_ids=ids)
    assert call.logit_slots is None
    assert call.argmax.tolist() == ((ids[:, -QUERY_TAIL:] + 1) % VOCAB).tolist()
