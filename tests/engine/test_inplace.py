"""INPLACE (fixed per-row slots): exact, checked clean under its own layout, and copy-free between steps."""

from __future__ import annotations

import pytest
import torch
from exactness import MAX_NEW, PROMPTS, assert_exact, decode, frequent_token, oracle, pair_for

from specviz.analysis.check import check_trace
from specviz.engine.batch import SeqState
from specviz.engine.kv.regions import LAYOUT, SPAN_STEP, RegionCache, RegionLayer, block_mask, query_block_causal
from specviz.engine.methods.inplace import PREFILL_SLACK, prefill_groups, run_inplace
from specviz.engine.step import Engine, EngineConfig
from specviz.errors import SpecvizError
from specviz.trace.io import load_trace, save_trace


@pytest.mark.parametrize("batch,k", [(1, 4), (3, 2), (16, 8)])
def test_exact_llama(batch: int, k: int) -> None:
    trace = decode("llama", "inplace", batch, k)
    assert_exact(trace, oracle("llama"))
    accepted = [r.accepted for s in trace.steps for r in s.rows]
    assert 0 < sum(accepted) < k * len(accepted), "ragged acceptance"


def test_pad_equals_eos() -> None:
    eos = frequent_token("llama")
    assert_exact(decode("llama", "inplace", 8, 4, eos=eos, pad=eos), oracle("llama", eos=eos, pad=eos))


def test_trace_declares_its_layout_and_checks_clean(tmp_path) -> None:
    trace = decode("llama", "inplace", 8, 4, kv_check_every=2)
    assert trace.header.layout == LAYOUT
    report = check_trace(trace)
    assert report.verdict == "clean", report.violations[:3]
    assert any("rectangular alignment" in note for note in report.skipped_checks)
    rows = [r for s in trace.steps for r in s.rows]
    assert any(r.kv_content_checked for r in rows) and all(r.kv_mismatch_slot is None for r in rows)
    assert all(r.kv_len == r.committed_before - 1 for r in rows)
    assert all(r.query_causal is True for r in rows), "the 4-D verify mask's causality is recorded"
    assert all(r.left_pad == 0 for r in rows if r.kv_len), "the region starts at slot 0"
    widths = {s.cache_len for s in trace.steps if s.batch_id == 0}
    assert len(widths) == 1, "one fixed width per batch"
    assert load_trace(save_trace(trace, tmp_path / "t.json.gz")).header.layout == LAYOUT


def test_the_cache_is_never_reallocated() -> None:
    pair = pair_for("llama")
    seqs = [SeqState(i, pair.tokenizer(t)["input_ids"]) for i, t in enumerate(PROMPTS[:6])]
    engine = Engine(EngineConfig(pair.target, pair.draft, 4, MAX_NEW, frozenset([1]), 0, pair.device))
    seen: list[tuple[int, int]] = []  # (rows, data pointer of layer 0's keys) at each step
    original = engine.step

    def spy(batch):
        cache = batch.target.cache
        assert isinstance(cache, RegionCache)
        seen.append((len(batch.seqs), cache.layers[0].keys.data_ptr() if cache.layers[0].is_initialized else 0))
        return original(batch)

    engine.step = spy
    run_inplace(engine, seqs, 6)
    assert len({ptr for _, ptr in seen[1:]}) == 1, "the cache was reallocated: slots moved"
    assert len({rows for rows, _ in seen}) > 1, "rows finished on the way (the prefix shrank in place)"


def test_rows_that_move_are_short_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finished rows are refilled from the back of the batch; the long prompt sits in front, so
    the copies move short rows only (the copy costs the mover's slots)."""
    pair = pair_for("llama")
    prompts = [pair.tokenizer(t)["input_ids"] for t in PROMPTS[:6]]
    long_prompt = [tok for p in prompts for tok in p] * 2
    seqs = [SeqState(i, p) for i, p in enumerate(prompts + [long_prompt])]  # the long one last
    engine = Engine(EngineConfig(pair.target, pair.draft, 4, MAX_NEW, frozenset([1]), 0, pair.device))
    copied: list[int] = []
    original = RegionCache.fill_holes

    def spy(self, holes, movers, used, active):
        copied.extend(used)
        return original(self, holes, movers, used, active)

    monkeypatch.setattr(RegionCache, "fill_holes", spy)
    run_inplace(engine, seqs, len(seqs))
    assert copied, "rows finished while others continued: something moved"
    assert max(copied) < len(long_prompt), "the long row was copied"


def test_steps_read_only_the_used_prefix_of_the_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's attention reads the region up to the last query slot of any row (rounded up to
    SPAN_STEP), not the slots every new token will need later; outputs stay exact."""
    spans: list[tuple[int, int, int]] = []  # (slots read, last query slot, region width)
    original = RegionLayer.update

    def spy(self, key_states, value_states, *args, **kwargs):
        keys, values = original(self, key_states, value_states, *args, **kwargs)
        if self.slots.rows is None:
            spans.append((keys.shape[2], int(self.slots.write_at.max()), self.slots.width))
        return keys, values

    monkeypatch.setattr(RegionLayer, "update", spy)
    assert_exact(decode("llama", "inplace", 8, 4), oracle("llama"))
    assert all(last < read <= width for read, last, width in spans), "every query slot is read"
    assert all(read % SPAN_STEP == 0 or read == width for read, _, width in spans)
    assert any(read < width for read, _, width in spans), "early steps read less than the region"


def test_mask_attends_prefix_and_causal_block_only() -> None:
    slots = torch.tensor([[2, 3], [5, 6]])
    mask = block_mask(slots, 8, torch.float32)[:, 0] == 0
    assert mask[0, 0].tolist() == [True] * 3 + [False] * 5
    assert mask[1, 1].tolist() == [True] * 7 + [False]


def test_query_causality_is_read_off_the_mask_fed() -> None:
    slots = torch.tensor([[2, 3, 4], [5, 6, 7]])
    mask = block_mask(slots, 8, torch.float32)
    assert query_block_causal(mask, slots).tolist() == [True, True]
    mask[1, 0, 0, 6] = 0.0  # row 1's first query now sees the second query's slot: not causal
    assert query_block_causal(mask, slots).tolist() == [True, False]


def test_faults_are_refused() -> None:
    with pytest.raises(SpecvizError, match="left-padded"):
        decode("llama", "inplace", 2, 2, fault="stale-kv")


@pytest.mark.parametrize(
    "lengths",
    [[2224, 300, 350, 400, 369, 10, 0, 12], [5] * 9, [0, 0], [1, 1000, 1, 999], list(range(40, 0, -3))],
)
def test_prefill_groups_cover_each_row_once_and_bound_the_padding(lengths: list[int]) -> None:
    groups = prefill_groups(lengths)
    rows = sorted(r for g in groups for r in g)
    assert rows == [r for r, n in enumerate(lengths) if n > 0], "every row with tokens, once"
    for group in groups:
        padded = max(lengths[r] for r in group) * len(group)
        assert padded <= PREFILL_SLACK * sum(lengths[r] for r in group)
    if 2224 in lengths:
        assert [lengths.index(2224)] in groups, "the long prompt is prefilled on its own"
