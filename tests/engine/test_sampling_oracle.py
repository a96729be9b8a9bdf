"""Sampling at T > 0 against oracles that share no code with the engine (issue 26, part 1).

The coupled batch-1 reference calls the same tempering, filter and noise functions as the engine,
so batched == batch-1 proves consistency, not correctness. Here every expectation comes from
elsewhere: probabilities computed by hand in Python floats (`oracles.py`), Hugging Face's own
logits warpers, the keyed-noise hash re-implemented from its definition, and chi-square tests of
the coupled sampler's marginals against those hand-built distributions.
"""

from __future__ import annotations

import math

import pytest
import torch
from oracles import (
    CHI2_CRITICAL_1E4,
    assert_chi_square,
    key_bits,
    key_gumbel,
    key_uniform,
    softmax,
    target_distribution,
)
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

# The engine under test: every name it is reached by, in one place.
from specviz.engine.sampling import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    STREAM_SAMPLE,
    SamplingParams,
    filter_logits,
    keyed_bits,
    keyed_gumbel,
    keyed_uniform,
    noisy_scores,
    probabilities,
    sample_coupled,
    tempered,
    top2_margin,
)

LOGITS = [2.0, 1.0, 0.5, 0.5, -1.0, -3.0]  # a tie at 0.5 (indices 2 and 3)


def engine_probs(logits: list[float], temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[float]:
    params = SamplingParams("coupled", temperature, top_p, top_k, 0)
    return probabilities(torch.tensor([logits]), params)[0].tolist()


# --- temperature, top-k, top-p against hand-computed distributions -------------------------------


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5, 3.0])
def test_temperature_matches_hand_softmax(temperature: float) -> None:
    # softmax(l / T) written out: exp(l_i / T) / sum_j exp(l_j / T).
    want = [math.exp(x / temperature) for x in LOGITS]
    want = [w / sum(want) for w in want]
    assert engine_probs(LOGITS, temperature) == pytest.approx(want, abs=1e-6)


def test_temperature_by_hand_numbers() -> None:
    # logits [0, ln 3] at T = 1: probabilities 1/4, 3/4. At T = 0.5: exp(2 ln 3) = 9, so 1/10, 9/10.
    # At T = 2: sqrt(3), so 1/(1 + sqrt 3), sqrt 3/(1 + sqrt 3). (T^2 would give 1/82 at T = 0.5.)
    logits = [0.0, math.log(3.0)]
    assert engine_probs(logits, 1.0) == pytest.approx([0.25, 0.75], abs=1e-6)
    assert engine_probs(logits, 0.5) == pytest.approx([0.1, 0.9], abs=1e-6)
    s3 = math.sqrt(3.0)
    assert engine_probs(logits, 2.0) == pytest.approx([1 / (1 + s3), s3 / (1 + s3)], abs=1e-6)


def test_top_k_by_hand() -> None:
    # top_k = 2 keeps logits 2.0 and 1.0: probabilities e^2/(e^2 + e), e/(e^2 + e) = e/(e + 1), 1/(e + 1).
    e = math.e
    assert engine_probs(LOGITS, 1.0, top_k=2) == pytest.approx([e / (e + 1), 1 / (e + 1), 0, 0, 0, 0], abs=1e-6)
    # top_k = 3 ends on the tie at 0.5: both tied entries stay (4 kept, as Hugging Face keeps them).
    kept = [p > 0 for p in engine_probs(LOGITS, 1.0, top_k=3)]
    assert kept == [True, True, True, True, False, False]


def test_top_k_edges() -> None:
    full = softmax(LOGITS)
    for k in (0, len(LOGITS), len(LOGITS) + 5):  # 0: off; k >= vocab: nothing to remove
        assert engine_probs(LOGITS, 1.0, top_k=k) == pytest.approx(full, abs=1e-6), k
    assert engine_probs(LOGITS, 1.0, top_k=1) == pytest.approx([1, 0, 0, 0, 0, 0], abs=1e-7)
    assert engine_probs(LOGITS, 1.0, top_k=len(LOGITS) - 1)[-1] == 0.0


def test_top_p_by_hand() -> None:
    # logits = log [0.5, 0.3, 0.2]. top_p = 0.6: mass before each entry 0, 0.5, 0.8; an entry is kept
    # while the mass before it is < 0.6, so the boundary token 0.3 (which crosses 0.6) is kept:
    # renormalised [0.5/0.8, 0.3/0.8, 0] = [0.625, 0.375, 0].
    logits = [math.log(0.5), math.log(0.3), math.log(0.2)]
    assert engine_probs(logits, 1.0, top_p=0.6) == pytest.approx([0.625, 0.375, 0.0], abs=1e-6)
    assert engine_probs(logits, 1.0, top_p=0.5) == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    assert engine_probs(logits, 1.0, top_p=0.81) == pytest.approx([0.5, 0.3, 0.2], abs=1e-6)
    assert engine_probs(logits, 1.0, top_p=0.01) == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    assert engine_probs(logits, 1.0, top_p=1.0) == pytest.approx([0.5, 0.3, 0.2], abs=1e-6)


def test_top_p_exact_boundary() -> None:
    # Four equal logits: probabilities exactly 1/4 in float32, mass before = 0, .25, .5, .75 exactly.
    # top_p = 0.5 is reached exactly by two tokens: the third (mass before = 0.5) is dropped.
    flat = [0.0, 0.0, 0.0, 0.0]
    assert sum(p > 0 for p in engine_probs(flat, 1.0, top_p=0.5)) == 2
    assert sum(p > 0 for p in engine_probs(flat, 1.0, top_p=0.5 + 1e-6)) == 3
    assert sum(p > 0 for p in engine_probs(flat, 1.0, top_p=0.25)) == 1
    assert sum(p > 0 for p in engine_probs(flat, 1.0, top_p=0.75)) == 3


def test_top_p_edges() -> None:
    # top_p = 1: no filter, even for a token whose probability (e^-30 ~ 1e-13) vanishes next to
    # float32 rounding of the cumulative mass. top_p = 0: Hugging Face keeps the most likely token.
    logits = [0.0, -30.0, -30.0, 1.0]
    assert all(p > 0 for p in engine_probs(logits, 1.0, top_p=1.0))
    assert engine_probs(logits, 1.0, top_p=0.0) == pytest.approx([0, 0, 0, 1.0])
    theirs = hf_probs(torch.tensor([logits]), 1.0, 0, 0.0)[0].tolist()
    assert theirs == pytest.approx([0, 0, 0, 1.0])


def test_top_k_then_top_p_by_hand() -> None:
    # T = 0.5 doubles the logits: [4, 2, 1, 1, -2, -6]. top_k = 4 keeps [4, 2, 1, 1]:
    # weights e^4, e^2, e, e. top_p = 0.9 on those: p0 = e^4 / (e^4 + e^2 + 2e) = 0.8315 < 0.9, so
    # entry 1 is kept too (mass before it 0.8315 < 0.9); mass before entry 2 is 0.9440 >= 0.9: dropped.
    e = math.e
    w = [e**4, e**2]
    want = [w[0] / sum(w), w[1] / sum(w), 0, 0, 0, 0]
    assert engine_probs(LOGITS, 0.5, top_k=4, top_p=0.9) == pytest.approx(want, abs=1e-6)
    assert target_distribution(LOGITS, 0.5, 4, 0.9) == pytest.approx(want, abs=1e-12)  # the oracle agrees


def test_filtered_entries_are_minus_infinity_and_kept_ones_untouched() -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0, -1.0]])
    out = filter_logits(logits, top_k=2)
    assert out[0].tolist() == [3.0, -math.inf, 2.0, -math.inf]
    assert torch.equal(filter_logits(logits), logits)
    params = SamplingParams("coupled", 2.0, 1.0, 0, 0)
    assert tempered(logits, params)[0].tolist() == [1.5, 0.5, 1.0, -0.5]


# --- against Hugging Face's warpers ------------------------------------------------------------


def hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    scores = TemperatureLogitsWarper(float(temperature))(None, logits.clone())
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(0.5, 0, 1.0), (1.0, 0, 1.0), (1.5, 0, 1.0), (1.0, 5, 1.0), (0.7, 1, 1.0), (1.0, 64, 1.0), (1.0, 0, 0.9),
     (1.5, 0, 0.5), (0.5, 0, 0.3), (0.8, 20, 0.8), (1.2, 3, 0.95)],
)  # fmt: skip
def test_matches_hugging_face_warpers(temperature: float, top_k: int, top_p: float) -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(16, 64, generator=gen) * 3
    params = SamplingParams("coupled", temperature, top_p, top_k, 0)
    ours = probabilities(logits, params)
    theirs = hf_probs(logits, temperature, top_k, top_p)
    assert torch.equal(ours > 0, theirs > 0), "a different set of tokens survives the filters"
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


# --- the coupled sampler's marginals (chi-square) ---------------------------------------------

N_SAMPLES = 12_000
# Three positions with different distributions, so a sampler reading the wrong slot fails too.
POSITION_LOGITS = [
    [1.5, 1.0, 0.3, 0.0, -0.4, -1.2],
    [-0.5, 0.8, 0.1, 1.6, -0.2, 0.4],
    [0.2, -1.0, 1.1, 0.5, 0.9, -0.3],
]


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(0.5, 0, 1.0), (1.0, 0, 1.0), (1.5, 0, 1.0), (1.0, 3, 1.0), (1.5, 4, 1.0), (1.0, 0, 0.7), (1.5, 0, 0.8),
     (0.5, 5, 0.9)],
)  # fmt: skip
def test_coupled_sampler_marginals(temperature: float, top_k: int, top_p: float) -> None:
    seed = 11
    params = SamplingParams("coupled", temperature, top_p, top_k, seed)
    logits = torch.tensor(POSITION_LOGITS)[None].expand(N_SAMPLES, -1, -1)
    seq_ids = torch.arange(N_SAMPLES) * 7 + 3  # independent keys: one sequence per sample
    indices = torch.full((N_SAMPLES, 1), 40) + torch.arange(3)[None, :]
    tokens = sample_coupled(logits, params, seq_ids, indices)
    for pos, row in enumerate(POSITION_LOGITS):
        counts = torch.bincount(tokens[:, pos], minlength=len(row)).tolist()
        want = target_distribution(row, temperature, top_k, top_p)
        assert_chi_square(counts, want, f"position {pos}, T={temperature}, top_k={top_k}, top_p={top_p}")


def test_coupled_sample_replays_the_noise_definition() -> None:
    # argmax(log p + g) with g the keyed Gumbel noise, all computed here in Python.
    seed, temperature = 3, 0.8
    params = SamplingParams("coupled", temperature, 1.0, 0, seed)
    seq_ids = [0, 5, 1 << 20]
    first = [7, 0, 123]
    logits = torch.tensor(POSITION_LOGITS)[None].expand(len(seq_ids), -1, -1)
    indices = torch.tensor(first)[:, None] + torch.arange(3)[None, :]
    got = sample_coupled(logits, params, torch.tensor(seq_ids), indices).tolist()
    for b, (seq, start) in enumerate(zip(seq_ids, first)):
        for pos, row in enumerate(POSITION_LOGITS):
            probs = softmax(row, temperature)
            scores = [math.log(p) + key_gumbel(seed, STREAM_SAMPLE, seq, start + pos, v) for v, p in enumerate(probs)]
            assert got[b][pos] == max(range(len(row)), key=scores.__getitem__), (b, pos)
    noisy = noisy_scores(logits, params, torch.tensor(seq_ids), indices)
    assert torch.equal(noisy.argmax(-1), torch.tensor(got))


# --- the keyed noise ---------------------------------------------------------------------------


def test_keyed_bits_match_the_hash_definition() -> None:
    # Pins the noise: a coupled trace recorded today must replay with tomorrow's engine. Large keys
    # check that 64-bit seeds and ids are folded to 32 bits without overflow.
    cases = [(0, 0, 0, 0), (5, 1, 9, 31), (2**40 + 3, 2, 2**33 + 7, 70_000), (123456789, 0, 4, 2**31 - 1)]
    for seed, stream, seq, index in cases:
        bits = keyed_bits(seed, stream, torch.tensor([seq]), torch.tensor([[index, index + 1]]), 5)
        for j in range(2):
            for v in range(5):
                assert int(bits[0, j, v]) == key_bits(seed, stream, seq, index + j, v), (seed, stream, seq, index, j, v)
        coin = keyed_bits(seed, stream, torch.tensor([seq]), torch.tensor([[index]]), None)
        assert int(coin[0, 0]) == key_bits(seed, stream, seq, index)
        u = keyed_uniform(seed, stream, torch.tensor([seq]), torch.tensor([[index]]), 3)
        assert u[0, 0].tolist() == [key_uniform(seed, stream, seq, index, v) for v in range(3)]
        g = keyed_gumbel(seed, stream, torch.tensor([seq]), torch.tensor([[index]]), 3)
        want = [key_gumbel(seed, stream, seq, index, v) for v in range(3)]
        assert g[0, 0].tolist() == pytest.approx(want, abs=1e-5)


def test_streams_are_distinct() -> None:
    # Part of the noise's definition (a recorded run replays with the same numbers), so pinned.
    assert (STREAM_SAMPLE, STREAM_ACCEPT, STREAM_RESIDUAL) == (0, 1, 2)


def uniform_bins(u: torch.Tensor, bins: int) -> list[int]:
    return torch.bincount((u.flatten().double() * bins).long(), minlength=bins).tolist()


def test_keyed_uniform_is_uniform() -> None:
    seq_ids = torch.arange(500)
    indices = torch.arange(8)[None, :].expand(500, -1)
    u = keyed_uniform(17, STREAM_SAMPLE, seq_ids, indices, 16)  # 64,000 draws
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert_chi_square(uniform_bins(u, 40), [1 / 40] * 40, "uniform over 40 bins")
    assert float(u.double().mean()) == pytest.approx(0.5, abs=0.005)
    assert float(u.double().var()) == pytest.approx(1 / 12, abs=0.002)
    coins = keyed_uniform(17, STREAM_ACCEPT, torch.arange(20_000), torch.zeros(20_000, 1, dtype=torch.long))
    assert coins.shape == (20_000, 1)
    assert_chi_square(uniform_bins(coins, 20), [1 / 20] * 20, "acceptance coins over 20 bins")


def test_keyed_gumbel_is_gumbel() -> None:
    g = keyed_gumbel(4, STREAM_RESIDUAL, torch.arange(400), torch.arange(5)[None, :].expand(400, -1), 20)
    # Through the Gumbel CDF exp(-exp(-g)) the draws are uniform again.
    u = torch.exp(-torch.exp(-g.double()))
    assert_chi_square(uniform_bins(u, 40), [1 / 40] * 40, "Gumbel CDF of the noise")
    assert float(g.double().mean()) == pytest.approx(0.5772156649, abs=0.02)  # Euler-Mascheroni
    assert float(g.double().var()) == pytest.approx(math.pi**2 / 6, abs=0.05)


def joint_counts(a: torch.Tensor, b: torch.Tensor, bins: int = 5) -> list[int]:
    ia = (a.flatten().double() * bins).long()
    ib = (b.flatten().double() * bins).long()
    return torch.bincount(ia * bins + ib, minlength=bins * bins).tolist()


def test_keyed_noise_independent_across_keys() -> None:
    # Pairs of draws that differ in one key component must be jointly uniform on 5 x 5 cells
    # (dof 24); Pearson correlation near zero.
    n = 20_000
    seq = torch.arange(n)
    idx = torch.full((n, 1), 9)
    base = keyed_uniform(2, STREAM_SAMPLE, seq, idx, 2)  # [n, 1, 2]
    others = {
        "next seq_id": keyed_uniform(2, STREAM_SAMPLE, seq + 1, idx, 2)[..., 0],
        "next index": keyed_uniform(2, STREAM_SAMPLE, seq, idx + 1, 2)[..., 0],
        "other stream": keyed_uniform(2, STREAM_ACCEPT, seq, idx, 2)[..., 0],
        "other seed": keyed_uniform(3, STREAM_SAMPLE, seq, idx, 2)[..., 0],
        "next vocab entry": base[..., 1],
    }
    for what, other in others.items():
        assert not torch.equal(base[..., 0], other), what
        assert_chi_square(joint_counts(base[..., 0], other), [1 / 25] * 25, what)
        corr = torch.corrcoef(torch.stack([base[..., 0].flatten(), other.flatten()]).double())[0, 1]
        assert abs(float(corr)) < 0.03, what


def test_noise_slices_equal_the_noise_computed_alone() -> None:
    seq_ids = torch.tensor([3, 8, 3])
    indices = torch.tensor([[4, 5, 6], [0, 1, 2], [10, 11, 12]])
    batch = keyed_gumbel(1, STREAM_SAMPLE, seq_ids, indices, 7)
    alone = keyed_gumbel(1, STREAM_SAMPLE, torch.tensor([3]), torch.tensor([[5]]), 7)
    assert torch.equal(batch[0, 1], alone[0, 0])
    assert torch.equal(batch[1, 2], keyed_gumbel(1, STREAM_SAMPLE, torch.tensor([8]), torch.tensor([[2]]), 7)[0, 0])


def test_top2_margin() -> None:
    assert top2_margin(torch.tensor([1.0, 4.0, 2.5])) == pytest.approx(1.5)
    assert top2_margin(torch.tensor([2.0, 2.0, 0.0])) == 0.0
    assert top2_margin(torch.tensor([-2.0, -1.0])) == pytest.approx(1.0)
    assert top2_margin(torch.tensor([5.0, -math.inf, -math.inf])) == 1e9  # one survivor: capped
    assert top2_margin(torch.tensor([-math.inf, -math.inf])) == 1e9  # nan: capped
    assert top2_margin(torch.tensor([3e9, 0.0])) == 1e9
    assert top2_margin(torch.tensor([1e9 - 64, 0.0])) < 1e9


def test_sampling_params_are_frozen() -> None:
    # Immutable and hashable: runs, caches and traces key on them.
    p = SamplingParams("coupled", 0.7, 0.9, 5, 3)
    assert hash(p) == hash(SamplingParams("coupled", 0.7, 0.9, 5, 3))
    with pytest.raises(AttributeError):
        p.temperature = 2.0  # type: ignore[misc]


def test_sampling_params_defaults() -> None:
    p = SamplingParams()
    assert (p.mode, p.temperature, p.top_p, p.top_k, p.seed) == ("greedy", 0.0, 1.0, 0, 0)
    assert p.greedy and not SamplingParams("coupled", 1.0).greedy
    assert CHI2_CRITICAL_1E4[1] > 15  # the oracle table is the tail, not the centre
