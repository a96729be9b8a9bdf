"""The verification rules on hand-built distributions (issue 26, part 2).

Rejection sampling, per slot j with target p_j and draft q_j: the draft x_j ~ q_j is accepted with
probability min(1, p_j(x) / q_j(x)); at the first rejection the token comes from
norm(max(0, p_j - q_j)); after k acceptances the bonus comes from p_k. Every slot has its own p and
q here, so an engine that builds a residual from the wrong slot fails. Expected numbers come from
`oracles.py` (plain Python) or are written out in comments.

Checks: `standard_ratio` on exact values; the whole of `verify` replayed token for token by a
plain-Python implementation of the rule over the keyed noise's definition; and chi-square tests of
the emitted token at slot 0, 1, 2 and the bonus, at several temperatures and filters.
"""

from __future__ import annotations

import math

import pytest
import torch
from oracles import assert_chi_square, key_gumbel, key_uniform, residual, softmax, target_distribution

# The engine under test: every name it is reached by, in one place.
from specviz.engine.rules import SampleKeys, TokenRules, agreeing_prefix, standard_ratio
from specviz.engine.sampling import STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_SAMPLE, SamplingParams

# Per-slot target p_j and draft q_j (k = 3), and the bonus distribution p_3.
P = [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.3, 0.1, 0.4, 0.2], [0.15, 0.35, 0.05, 0.45]]
Q = [[0.25, 0.25, 0.25, 0.25], [0.4, 0.3, 0.2, 0.1], [0.2, 0.2, 0.2, 0.4]]
# Acceptance probability per slot: sum_x min(p, q) = 0.8, 0.6, 0.7, so slot 1 is reached by 80%
# of samples, slot 2 by 48%, the bonus by 33.6%.
# Residuals: slot 0: max(0, p - q) = [.15, .05, 0, 0] -> [0.75, 0.25, 0, 0]
#            slot 1: [0, 0, .1, .3] -> [0, 0, 0.25, 0.75];  slot 2: [.1, 0, .2, 0] -> [1/3, 0, 2/3, 0]
RESIDUALS = [[0.75, 0.25, 0.0, 0.0], [0.0, 0.0, 0.25, 0.75], [1 / 3, 0.0, 2 / 3, 0.0]]
K = len(Q)
V = len(P[0])


def logits_for(probs: list[list[float]], temperature: float) -> torch.Tensor:
    """Logits whose softmax at `temperature` is `probs`: T * log p (a T^2 bug then shows)."""
    return torch.tensor([[temperature * math.log(x) for x in row] for row in probs])


def draw_drafts(q: list[list[float]], n: int, seed: int) -> torch.Tensor:
    """Drafts x_j ~ q_j, by inverse CDF with torch's own generator (not the engine's noise)."""
    gen = torch.Generator().manual_seed(seed)
    cdf = torch.tensor(q, dtype=torch.float64).cumsum(-1)  # [K, V]
    u = torch.rand(n, len(q), 1, generator=gen, dtype=torch.float64)
    return (u > cdf[None]).sum(-1).clamp(max=len(q[0]) - 1)


def verify(params: SamplingParams, drafts: torch.Tensor, p_logits: torch.Tensor, q_logits, seq_ids, first, ratio=None):
    rules = TokenRules(params) if ratio is None else TokenRules(params, ratio)
    n = drafts.shape[0]
    target = p_logits[None].expand(n, -1, -1)
    draft = None if q_logits is None else q_logits[None].expand(n, -1, -1)
    return rules.verify(drafts, draft, target, SampleKeys(seq_ids, first))


# --- the acceptance ratio --------------------------------------------------------------------


def test_standard_ratio_exact_values() -> None:
    p = torch.tensor([0.2, 0.5, 0.0, 0.3, 0.6])
    q = torch.tensor([0.4, 0.5, 0.1, 0.0, 0.2])
    # min(1, p/q): 0.5, 1, 0, (q = 0: p/tiny -> capped at) 1, min(1, 3) = 1
    assert standard_ratio(p, q).tolist() == pytest.approx([0.5, 1.0, 0.0, 1.0, 1.0])
    assert standard_ratio(torch.tensor([0.0]), torch.tensor([0.0])).tolist() == [0.0]
    assert standard_ratio(torch.tensor([0.03]), torch.tensor([0.12])).tolist() == pytest.approx([0.25])


def test_sample_keys_at() -> None:
    keys = SampleKeys(torch.tensor([0, 4]), torch.tensor([3, 10]))
    assert keys.at(0).tolist() == [[3], [10]]
    assert keys.at(2, 3).tolist() == [[5, 6, 7], [12, 13, 14]]
    assert keys.at(torch.tensor([1, 0]), 2).tolist() == [[4, 5], [10, 11]]


def test_sample_keys_are_frozen() -> None:
    keys = SampleKeys(torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(AttributeError):
        keys.first = torch.tensor([1])  # type: ignore[misc]


def test_agreeing_prefix() -> None:
    drafts = torch.tensor([[1, 2, 3], [1, 0, 3], [5, 2, 3], [1, 2, 3]])
    target = torch.tensor([[1, 2, 0], [1, 2, 3], [1, 2, 3], [1, 2, 3]])
    assert agreeing_prefix(drafts, target).tolist() == [2, 1, 0, 3]


# --- greedy and coupled verification ------------------------------------------------------------


def test_greedy_verify_and_select() -> None:
    rules = TokenRules()
    assert not rules.keeps_draft_logits
    target = torch.tensor(
        [[[0.0, 2.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 5.0]], [[9.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]]]
    )
    drafts = torch.tensor([[1, 0], [0, 1]])
    matched, tokens = rules.verify(drafts, None, target, None)
    assert tokens.tolist() == [[1, 0, 2], [0, 2, 1]]
    assert matched.tolist() == [2, 1]
    assert rules.select(target, None).tolist() == [[1, 0, 2], [0, 2, 1]]
    # Above, argmax over the slots would happen to agree; with q = 2 slots over V = 4 tokens it cannot.
    assert rules.select(torch.tensor([[[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 1.0]]]), None).tolist() == [[1, 0]]
    keys = SampleKeys(torch.tensor([0, 1]), torch.tensor([4, 9]))  # greedy ignores the sampling keys
    assert rules.select(target, keys).tolist() == [[1, 0, 2], [0, 2, 1]]


def test_coupled_verify_replays_the_definition() -> None:
    seed, temperature = 9, 1.3
    params = SamplingParams("coupled", temperature, 1.0, 0, seed)
    rules = TokenRules(params)
    assert not rules.keeps_draft_logits
    logits = logits_for(P, temperature)  # softmax at T is P
    seq_ids, first = [2, 7], [5, 0]
    keys = SampleKeys(torch.tensor(seq_ids), torch.tensor(first))

    def coupled(seq: int, index: int, probs: list[float]) -> int:
        scores = [math.log(p) + key_gumbel(seed, STREAM_SAMPLE, seq, index, v) for v, p in enumerate(probs)]
        return max(range(V), key=scores.__getitem__)

    want = [[coupled(s, f + j, P[j]) for j in range(K + 1)] for s, f in zip(seq_ids, first)]
    drafts = torch.tensor([want[0][:K], [want[1][0], (want[1][1] + 1) % V, want[1][2]]])
    matched, tokens = rules.verify(drafts, None, logits[None].expand(2, -1, -1), keys)
    assert tokens.tolist() == want
    assert matched.tolist() == [K, 1]
    # select(offset=j) chooses the token at first + j: the draft's slot j sees the same noise.
    one = rules.select(logits[None, 2:3].expand(2, -1, -1), keys, offset=2)
    assert one.tolist() == [[want[0][2]], [want[1][2]]]


# --- rejection sampling, token for token ---------------------------------------------------------


def rejection_oracle(seed: int, seq: int, first: int, drafts: list[int], p: list[list[float]], q: list[list[float]]):
    """(matched, emitted tokens) of one row, from the rule's definition and the noise's definition."""
    for j, x in enumerate(drafts):
        coin = key_uniform(seed, STREAM_ACCEPT, seq, first + j)
        if not coin < min(1.0, p[j][x] / q[j][x]):
            weights = residual(p[j], q[j])
            break
        # accepted: on to the next slot
    else:
        j = len(drafts)
        weights = p[j]
    scores = [math.log(w) + key_gumbel(seed, STREAM_RESIDUAL, seq, first + j, v) if w > 0 else -math.inf
              for v, w in enumerate(weights)]  # fmt: skip
    return j, drafts[:j] + [max(range(len(weights)), key=scores.__getitem__)]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_rejection_verify_replays_the_definition(temperature: float) -> None:
    seed, n = 21, 300
    params = SamplingParams("rejection", temperature, 1.0, 0, seed)
    assert TokenRules(params).keeps_draft_logits
    drafts = draw_drafts(Q, n, seed=1)
    seq_ids = torch.arange(n) * 3 + 1
    first = torch.arange(n) % 17 + 4
    matched, tokens = verify(params, drafts, logits_for(P, temperature), logits_for(Q, temperature), seq_ids, first)
    assert tokens.shape == (n, K + 1)
    for r in range(n):
        m, emitted = rejection_oracle(seed, int(seq_ids[r]), int(first[r]), drafts[r].tolist(), P, Q)
        assert int(matched[r]) == m, r
        assert tokens[r, : m + 1].tolist() == emitted, r
    assert 0 < int((matched == 0).sum()) and 0 < int((matched == K).sum())  # every branch was taken


def test_rejection_without_drafts_samples_from_p() -> None:
    seed, n = 4, 200
    params = SamplingParams("rejection", 1.0, 1.0, 0, seed)
    p = logits_for(P[:1], 1.0)
    drafts = torch.zeros(n, 0, dtype=torch.long)
    matched, tokens = verify(params, drafts, p, None, torch.arange(n), torch.full((n,), 6))
    assert matched.tolist() == [0] * n
    for r in range(n):
        assert tokens[r].tolist() == rejection_oracle(seed, r, 6, [], P, Q)[1]


def test_rejection_needs_draft_logits() -> None:
    params = SamplingParams("rejection", 1.0, 1.0, 0, 0)
    with pytest.raises(ValueError, match="draft"):
        verify(
            params,
            torch.zeros(2, 1, dtype=torch.long),
            logits_for(P[:2], 1.0),
            None,
            torch.arange(2),
            torch.zeros(2, dtype=torch.long),
        )


def test_rejection_deterministic_edges() -> None:
    # q = p at a slot: min(1, p/q) = 1, always accepted. p(x) = 0 where the draft put x: never.
    params = SamplingParams("rejection", 1.0, 1.0, 0, 3)
    n = 500
    p = [[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]
    q = [[0.5, 0.5, 0.0, 0.0]]
    p_logits = torch.tensor([[math.log(x) if x else -math.inf for x in row] for row in p])
    drafts = draw_drafts(q, n, seed=2)
    matched, _ = verify(params, drafts, p_logits, p_logits[:1], torch.arange(n), torch.zeros(n, dtype=torch.long))
    assert matched.tolist() == [1] * n
    drafts = torch.full((n, 1), 3)  # the target gives token 3 probability 0
    q_logits = torch.zeros(1, 4)
    matched, tokens = verify(params, drafts, p_logits, q_logits, torch.arange(n), torch.zeros(n, dtype=torch.long))
    assert matched.tolist() == [0] * n
    assert set(tokens[:, 0].tolist()) <= {0, 1}  # residual max(0, p - 1/4) = [.25, .25, 0, 0]


# --- rejection sampling, in distribution (chi-square) --------------------------------------------

N = 24_000


def emitted_counts(matched: torch.Tensor, tokens: torch.Tensor, drafts: torch.Tensor, slot: int) -> list[int]:
    """Counts of the token emitted at `slot` over the rows that reached it (accepted >= slot drafts)."""
    reached = matched >= slot
    padded = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1)
    emitted = torch.where(torch.arange(K + 1)[None, :] < matched[:, None], padded, tokens)
    return torch.bincount(emitted[reached, slot], minlength=V).tolist()


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.5, 0, 1.0), (1.0, 3, 1.0), (1.5, 0, 0.8)]
)
def test_rejection_emits_p_at_every_slot(temperature: float, top_k: int, top_p: float) -> None:
    # Given the drafts before it were accepted, the token emitted at slot j is distributed as p_j
    # (after temperature and filters); at slot k (all accepted) it is the bonus, also from p_k.
    # The draft samples from the same tempered, filtered q the engine compares against.
    seed = 8 + top_k
    params = SamplingParams("rejection", temperature, top_p, top_k, seed)
    p_logits, q_logits = logits_for(P, temperature), logits_for(Q, temperature)
    p_want = [target_distribution(row.tolist(), temperature, top_k, top_p) for row in p_logits]
    q_used = [target_distribution(row.tolist(), temperature, top_k, top_p) for row in q_logits]
    drafts = draw_drafts(q_used, N, seed=seed)
    seq_ids = torch.arange(N) * 5 + 2
    first = torch.full((N,), 30)
    matched, tokens = verify(params, drafts, p_logits, q_logits, seq_ids, first)
    for slot in range(K + 1):
        counts = emitted_counts(matched, tokens, drafts, slot)
        assert sum(counts) > 2000, f"slot {slot} reached too rarely to test"
        assert_chi_square(counts, p_want[slot], f"slot {slot} (T={temperature}, top_k={top_k}, top_p={top_p})")


def test_rejection_acceptance_and_residual_per_slot() -> None:
    # Acceptance rate at slot j given it was reached = sum_x min(p_j, q_j) (0.8, 0.6, 0.7); a
    # rejected slot's token follows the residual of that slot (RESIDUALS, by hand in the header).
    params = SamplingParams("rejection", 1.0, 1.0, 0, 77)
    drafts = draw_drafts(Q, N, seed=5)
    matched, tokens = verify(
        params, drafts, logits_for(P, 1.0), logits_for(Q, 1.0), torch.arange(N), torch.zeros(N, dtype=torch.long)
    )
    for j, want_rate in enumerate([0.8, 0.6, 0.7]):
        reached = int((matched >= j).sum())
        accepted = int((matched >= j + 1).sum())
        sigma = math.sqrt(want_rate * (1 - want_rate) / reached)
        assert abs(accepted / reached - want_rate) < 5 * sigma, (j, accepted / reached)
        rejected_here = matched == j
        counts = torch.bincount(tokens[rejected_here, j], minlength=V).tolist()
        assert_chi_square(counts, RESIDUALS[j], f"residual at slot {j}")
        assert residual(P[j], Q[j]) == pytest.approx(RESIDUALS[j])  # the comment's hand numbers


def test_rejection_acceptance_per_draft_token() -> None:
    # Slot 0 with q uniform and p = [.4, .3, .2, .1]: a draft of token x is accepted with
    # probability min(1, p(x)/q(x)) = 1, 1, 0.8, 0.4.
    params = SamplingParams("rejection", 1.0, 1.0, 0, 12)
    n = 6000
    for x, want in enumerate([1.0, 1.0, 0.8, 0.4]):
        drafts = torch.full((n, 1), x)
        matched, _ = verify(
            params,
            drafts,
            logits_for(P[:2], 1.0),
            logits_for(Q[:1], 1.0),
            torch.arange(n),
            torch.zeros(n, dtype=torch.long),
        )
        rate = float(matched.double().mean())
        if want == 1.0:
            assert rate == 1.0
        else:
            assert abs(rate - want) < 5 * math.sqrt(want * (1 - want) / n), (x, rate)


def test_swapped_ratio_and_empty_residual_fall_back_to_p() -> None:
    # A ratio that rejects everything, at slot 0 where p == q exactly (no residual mass), while
    # slot 1 has residual mass: the rule falls back to sampling p_0 at slot 0 (the emptiness is
    # judged per slot, over the vocabulary).
    params = SamplingParams("rejection", 1.0, 1.0, 0, 5)
    p_logits = logits_for(P[:3], 1.0)
    q_logits = torch.stack([p_logits[0], logits_for(Q[1:2], 1.0)[0]])
    drafts = draw_drafts([P[0], Q[1]], N, seed=3)
    never = lambda p, q: p * 0  # noqa: E731
    matched, tokens = verify(
        params, drafts, p_logits, q_logits, torch.arange(N), torch.zeros(N, dtype=torch.long), never
    )
    assert matched.tolist() == [0] * N
    assert_chi_square(torch.bincount(tokens[:, 0], minlength=V).tolist(), softmax(p_logits[0].tolist()), "fallback")


def test_wrong_slot_residual_would_be_caught() -> None:
    # Sanity of the test design: slot 1's residual differs from slot 0's by a wide margin, so a
    # rule that reused slot 0's distributions at slot 1 would fail the chi-square test above.
    assert residual(P[1], Q[1]) != pytest.approx(residual(P[0], Q[0]))
    assert P[1] != P[0] and Q[1] != Q[0]
