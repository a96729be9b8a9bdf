"""Batched speculative decoding must be token-identical to batch-1 greedy decoding (the oracle).

The oracle (`specviz.engine.reference`) shares no code with the batched engine: it feeds one
unpadded sequence and lets the model infer positions. It is itself checked against HF generate.
"""

from __future__ import annotations

import pytest
import torch
from exactness import MAX_NEW, PROMPTS, assert_exact, decode, frequent_token, oracle, pair_for
from tiny import FAMILIES, noisy_draft

from specviz.engine.reference import greedy_reference
from specviz.engine.run import RunConfig, run


# Very different lengths in one batch: 1 token next to 90.
def test_oracle_matches_hf_generate() -> None:
    pair = pair_for("llama")
    for text in PROMPTS[:4]:
        ids = torch.tensor([pair.tokenizer(text)["input_ids"]])
        generated = pair.target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=1,
            pad_token_id=0,
        )[0, ids.shape[1] :].tolist()
        mine = greedy_reference(pair.target, ids[0].tolist(), MAX_NEW, frozenset([1]), pair.device)[0]
        assert mine == generated


def test_oracle_masks_stop_tokens_before_min_new_tokens_as_hf_generate_does() -> None:
    """A stop token the unmasked oracle chooses second is masked until min_new_tokens (vLLM's and
    transformers' min_tokens): the oracle then agrees with HF generate's min_new_tokens, and
    differs from itself without it."""
    pair = pair_for("llama")
    ids = pair.tokenizer(PROMPTS[0])["input_ids"]
    plain = greedy_reference(pair.target, ids, MAX_NEW, frozenset(), pair.device)[0]
    stop = plain[1]
    masked = greedy_reference(pair.target, ids, MAX_NEW, frozenset([stop]), pair.device, min_new_tokens=4)[0]
    generated = pair.target.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=MAX_NEW,
        min_new_tokens=4,
        do_sample=False,
        eos_token_id=stop,
        pad_token_id=0,
    )[0, len(ids) :].tolist()
    assert masked == generated
    assert stop not in masked[:4] and masked[1] != plain[1]
    assert greedy_reference(pair.target, ids, MAX_NEW, frozenset([stop]), pair.device)[0] == plain[:2]


# Every batch size at k=4, every draft length at batch 3 and 16 (a cross product costs minutes).
LLAMA_GRID = [(b, 4) for b in (1, 2, 3, 8, 16)] + [(b, k) for b in (3, 16) for k in (1, 2, 8)]


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
@pytest.mark.parametrize("batch,k", LLAMA_GRID)
def test_exact_llama(method: str, batch: int, k: int) -> None:
    trace = decode("llama", method, batch, k)
    assert_exact(trace, oracle("llama"))
    accepted = [r.accepted for s in trace.steps for r in s.rows]
    assert 0 < sum(accepted) < k * len(accepted), "test pair must produce ragged acceptance"


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "llama"])
@pytest.mark.parametrize("method", ["eqspec", "exspec", "inplace"])
@pytest.mark.parametrize("batch,k", [(3, 2), (8, 4)])
def test_exact_other_families(family: str, method: str, batch: int, k: int) -> None:
    assert_exact(decode(family, method, batch, k), oracle(family))


def test_baseline_batched_exact() -> None:
    for batch in (1, 5, 16):
        assert_exact(decode("llama", "baseline", batch, 0), oracle("llama"))


@pytest.mark.parametrize("method", ["eqspec", "exspec", "inplace"])
def test_rows_ending_early_by_eos(method: str) -> None:
    eos = frequent_token("llama")
    expected = oracle("llama", eos=eos)
    assert any(len(o) < MAX_NEW for o in expected), "some rows must end by EOS"
    assert any(len(o) == MAX_NEW for o in expected), "and some by max_new_tokens"
    trace = decode("llama", method, 8, 4, eos=eos)
    assert_exact(trace, expected)
    for seq in trace.sequences:
        assert eos not in seq.output_ids[:-1], "no token after EOS"


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_pad_equals_eos(method: str) -> None:
    eos = frequent_token("llama")
    assert_exact(decode("llama", method, 8, 4, eos=eos, pad=eos), oracle("llama", eos=eos, pad=eos))


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_generated_token_equal_to_pad(method: str) -> None:
    pad = frequent_token("llama")  # a token the model generates, used as the pad id
    assert any(pad in o for o in oracle("llama"))
    assert_exact(decode("llama", method, 8, 4, pad=pad), oracle("llama", pad=pad))


@pytest.mark.parametrize("window_factor", [1, 4])
@pytest.mark.parametrize("policy", ["reference", "largest", "converge"])
def test_exspec_windows(window_factor: int, policy: str) -> None:
    trace = decode("llama", "exspec", 4, 4, exspec_window=4 * window_factor, exspec_policy=policy)
    assert_exact(trace, oracle("llama"))
    assert trace.header.options["exspec_window"] == 4 * window_factor


def _tiny_gemma3(window: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from specviz.engine.models import ModelPair

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=window,
        max_position_embeddings=512,
        layer_types=["sliding_attention", "full_attention"],
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    target = Gemma3ForCausalLM(cfg).float().eval()
    draft = noisy_draft(target)
    base = pair_for("llama")
    return ModelPair(
        target=target,
        draft=draft,
        tokenizer=base.tokenizer,
        target_name="tiny-gemma3",
        draft_name="tiny-gemma3-draft",
        eos_token_ids=[1],
        pad_token_id=0,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


def test_sliding_window_model_exact_below_and_past_its_window() -> None:
    """Gemma-3 mixes sliding and full layers; tests/engine/test_families.py covers more windowed families."""
    pair = _tiny_gemma3(window=16)
    short = [p for p in PROMPTS if len(p) < 30]
    cfg = RunConfig(method="eqspec", batch_size=4, draft_k=3, max_new_tokens=16, reference=True)
    trace = run(pair, short, cfg)
    for seq in trace.sequences:
        assert seq.output_ids == seq.reference_ids
    past = run(pair, ["m" * 80, "ab"], RunConfig(method="eqspec", batch_size=2, draft_k=2, max_new_tokens=8))
    assert all(seq.output_ids == seq.reference_ids for seq in past.sequences)


@pytest.mark.parametrize("batch", [4, 16])
def test_exspec_gathers_from_the_pool_or_the_last_batch_alike(batch: int, monkeypatch) -> None:
    """A group that did not change is rebuilt from the last step's batch (the pools fall behind),
    any other from the pool rows once the last batch is stored (whole rows when it was carried
    over); every path runs here and the outputs stay exact."""
    import specviz.engine.methods.exspec as exspec
    from specviz.engine.kv.pool import KVPool

    sources = {"pool": 0, "last batch": 0, "whole rows stored": 0}
    take, rebuild, store = KVPool.take, exspec.rebuild, KVPool.store_step

    def counted_store(self, *args, whole_rows=False, **kwargs):
        sources["whole rows stored"] += int(whole_rows)
        return store(self, *args, whole_rows=whole_rows, **kwargs)

    def counted_take(self, ids):
        sources["pool"] += 1
        return take(self, ids)

    def counted_rebuild(*args, **kwargs):
        sources["last batch"] += 1
        return rebuild(*args, **kwargs)

    monkeypatch.setattr(KVPool, "take", counted_take)
    monkeypatch.setattr(exspec, "rebuild", counted_rebuild)
    monkeypatch.setattr(KVPool, "store_step", counted_store)
    eos = frequent_token("llama")  # rows end at different steps: the group shrinks
    assert_exact(decode("llama", "exspec", batch, 4, eos=eos, exspec_window=16), oracle("llama", eos=eos))
    assert sources["pool"] > 0 and sources["last batch"] > 0, sources
    assert sources["whole rows stored"] > 0, "a carried-over group ended and its rows were stored whole"


@pytest.mark.parametrize("in_place", [True, False])
def test_exspec_new_sequences_are_prefilled_into_their_batch_rows(in_place: bool, monkeypatch) -> None:
    """A sequence enters the pools when first chosen: prefilled straight into its row of the batch
    (nothing gathered before the first step), or, for a model whose sliding layers HF keeps,
    prefilled alone, admitted to the pool and gathered. Groups change on the way (window 16,
    batch 4), so the pools must have learned the new rows' slots; outputs stay exact either way."""
    import specviz.engine.methods.exspec as exspec
    from specviz.engine.kv.moves import HeadroomGather
    from specviz.engine.step import Engine

    monkeypatch.setattr(exspec, "prefills_in_place", lambda model: in_place)
    gathers: list[int] = []
    before_first_step: list[int] = []
    gather, step = HeadroomGather.__call__, Engine.step

    def counted_gather(self, tensor, room):
        gathers.append(len(self.rows))
        return gather(self, tensor, room)

    def first_step(self, batch):
        if not before_first_step:
            before_first_step.append(len(gathers))
        return step(self, batch)

    monkeypatch.setattr(HeadroomGather, "__call__", counted_gather)
    monkeypatch.setattr(Engine, "step", first_step)
    # window order (prompt order): the first group holds prompts of several tokens
    trace = decode("llama", "exspec", 4, 4, exspec_window=16, exspec_policy="reference")
    assert_exact(trace, oracle("llama"))
    assert (before_first_step[0] == 0) == in_place, before_first_step
    assert len({tuple(r.seq_id for r in s.rows) for s in trace.steps}) > 2, "groups changed"
