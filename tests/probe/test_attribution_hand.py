"""The attribution rule (specviz/probe/attribution.py) on hand-sized inputs with answers worked out
in the comments: the quartile interpolation, the MAD cut, both outlier criteria and their
boundaries, the noise estimate, each verdict's reason, and the run verdict's order."""

from __future__ import annotations

import math

import pytest

from specviz.probe.attribution import FLOOR, decide, estimate_noise, run_verdict
from specviz.probe.compare import Evidence


def shared(index: int, median: float | None, largest: float | None) -> Evidence:
    """A prompt answered alike by both sides, with its shared tokens' median and largest change."""
    return Evidence(index, 20, 20, "token", prefix_tokens=10, prefix_median=median, prefix_max=largest)


def test_the_quartile_is_interpolated_and_the_cut_uses_the_lower_half() -> None:
    """Levels 1e-5..1e-2: L = [-5, -4, -3, -2]. Lower quartile at position 0.75: -5 + 0.75 = -4.25;
    median -3.5; lower half (<= -3.5) |L - base| = [0.75, 0.25], median 0.5; spread
    1.4826 * 0.5 = 0.7413; cut = -4.25 + max(1, 4 * 0.7413) = -1.2848. Largest changes 10x each:
    X = [-4, -3, -2, -1], cut_X = -0.2848: no outlier. Noise = the largest inlier change, 0.1;
    typical = 10 ** -3.5."""
    noise = estimate_noise([shared(i, 10.0 ** -(5 - i), 10.0 ** -(4 - i)) for i in range(4)])
    assert noise.prompts == 4 and noise.outliers == frozenset()
    assert noise.baseline == pytest.approx(10**-4.25, rel=1e-9)
    assert noise.cut == pytest.approx(10 ** (-4.25 + 4 * 1.4826 * 0.5), rel=1e-9)
    assert noise.estimate == pytest.approx(0.1, rel=1e-9)
    assert noise.typical == pytest.approx(10**-3.5, rel=1e-9)


def test_a_prompt_perturbed_throughout_stands_out_by_its_median() -> None:
    """L = [-4, -4, -4, -4, -1]: base -4, spread 0, cut -3; prompt 4 (-1) stands out. Its moved
    factor: 1e-1 / 1e-4 = 1000x. Noise from the inliers only: their largest change, 1e-3."""
    evs = [shared(i, 1e-4, 1e-3) for i in range(4)] + [shared(4, 1e-1, 1e-1)]
    noise = estimate_noise(evs)
    assert noise.outliers == frozenset({(4, 0)})
    assert noise.estimate == pytest.approx(1e-3, rel=1e-9)
    assert noise.cut == pytest.approx(1e-3, rel=1e-9)
    assert decide(evs[4], noise) == ("identical", "same answer, but its shared tokens moved 1000x the baseline")
    assert decide(evs[0], noise) == ("identical", "same answer")
    flipped = Evidence(4, 20, 20, "token", divergence=3, prefix_median=1e-1, prefix_max=1e-1, gap_a=1e-9)
    assert decide(flipped, noise) == ("suspect", "its shared tokens moved 1000x the baseline: this prompt stands out")


def test_a_prompt_perturbed_at_one_token_stands_out_by_its_largest_change() -> None:
    """Medians all 1e-4 (no cut by median); largest changes X = [-3, -3, -3, -3, 0]: cut_X = -2,
    prompt 4 (0) stands out, and its reason names that one change."""
    evs = [shared(i, 1e-4, 1e-3) for i in range(4)] + [shared(4, 1e-4, 1.0)]
    noise = estimate_noise(evs)
    assert noise.outliers == frozenset({(4, 0)})
    assert decide(evs[4], noise)[1] == (
        "same answer, but a shared token moved 1, far beyond the other prompts' largest changes"
        " (prompts stand out above 0.01)"
    )


def test_a_level_exactly_at_the_cut_does_not_stand_out() -> None:
    """L = [-4, -4, -4, -4, -3]: cut = -4 + 1 = -3, and -3 is not above it; X likewise."""
    evs = [shared(i, 1e-4, 1e-4) for i in range(4)] + [shared(4, 1e-3, 1e-3)]
    noise = estimate_noise(evs)
    assert noise.outliers == frozenset()
    assert noise.estimate == pytest.approx(1e-3, rel=1e-9)


def test_levels_below_the_floor_count_at_the_floor_and_no_levels_mean_floor_noise() -> None:
    """0 and None are clamped to FLOOR (1e-5): every L = -5, estimate = FLOOR. No measured prompt:
    FLOOR, nothing typical, nothing stands out."""
    noise = estimate_noise([shared(0, 0.0, None), shared(1, 0.0, 0.0)])
    assert (noise.estimate, noise.prompts, noise.outliers) == (FLOOR, 2, frozenset())
    assert noise.baseline == pytest.approx(FLOOR, rel=1e-9) and noise.typical == pytest.approx(FLOOR, rel=1e-9)
    empty = estimate_noise([shared(0, None, None)])
    assert (empty.estimate, empty.typical, empty.baseline, empty.cut, empty.prompts) == (FLOOR, None, None, None, 0)


@pytest.fixture
def quiet():
    """Noise 1e-3 (the largest inlier change), nobody stands out."""
    return estimate_noise([shared(i, 1e-4, 1e-3) for i in range(5)])


def diverged(**fields) -> Evidence:
    return Evidence(7, 20, 20, "token", divergence=5, prefix_median=1e-4, prefix_max=1e-3, **fields)


def test_each_verdict_and_its_reason(quiet) -> None:
    assert decide(diverged(gap_a=2e-3), quiet) == ("suspect", "reference margin 0.002 exceeds the noise 0.001")
    assert decide(diverged(gap_a=2e-3, lower_bound=True), quiet) == (
        "suspect",
        "reference margin at least 0.002 exceeds the noise 0.001",
    )
    # At the noise exactly: not above it, a near-tie.
    at_noise = decide(diverged(gap_a=quiet.estimate), quiet)
    assert at_noise == ("numerical", "reference margin 0.001 within the noise 0.001")
    assert decide(diverged(gap_a=5e-4, lower_bound=True), quiet) == (
        "unattributed",
        "the other token is outside the top logprobs; reference margin >= 0.0005, noise 0.001",
    )
    # No reference margin: the swing is judged (side A gave no logprobs there: gap_b alone, 7e-4).
    assert decide(diverged(gap_b=7e-4), quiet) == ("numerical", "swing 0.0007 within the noise 0.001")
    assert decide(diverged(), quiet)[0] == "unattributed"


def test_the_run_verdict_is_the_worst() -> None:
    order = ["identical", "numerical", "unattributed", "suspect"]
    for i, worst in enumerate(order):
        assert run_verdict(order[: i + 1]) == worst
        assert run_verdict(reversed(order[: i + 1])) == worst
    assert run_verdict([]) == "identical"


def test_one_and_two_prompts() -> None:
    """One prompt: every quantile is its own level (no neighbour to interpolate with). Two, L = [-5, -3]:
    base = -5 + 0.25 * 2 = -4.5; lower half (<= -4) [-5]: MAD 0.5, spread 0.7413;
    cut = -4.5 + 4 * 0.7413."""
    one = estimate_noise([shared(0, 1e-3, 1e-2)])
    assert one.baseline == pytest.approx(1e-3, rel=1e-9) and one.cut == pytest.approx(1e-2, rel=1e-9)
    two = estimate_noise([shared(0, 1e-5, 1e-5), shared(1, 1e-3, 1e-3)])
    assert two.baseline == pytest.approx(10**-4.5, rel=1e-9)
    assert two.cut == pytest.approx(10 ** (-4.5 + 4 * 1.4826 * 0.5), rel=1e-9)


def test_a_median_at_the_cut_is_not_the_reason_a_prompt_stands_out() -> None:
    """L = [-4, -4, -4, -4, -3]: prompt 4's median sits at the cut (-3), not above; its largest change
    (1, X = 0 against cut_X = -2) is what makes it stand out, and its reason says so."""
    evs = [shared(i, 1e-4, 1e-3) for i in range(4)] + [shared(4, 1e-3, 1.0)]
    noise = estimate_noise(evs)
    assert noise.outliers == frozenset({(4, 0)}) and noise.cut == pytest.approx(1e-3, rel=1e-9)
    assert "a shared token moved 1," in decide(evs[4], noise)[1]


def test_a_bug_that_moves_every_prompt_alike_needs_the_batch_calibration() -> None:
    """A bug that moves every prompt a little (the test server's `mask`): every level is 0.1 and
    every largest change 0.5, so the least-disturbed quarter is the bug itself, nothing stands
    out, the noise is 0.5 and a divergence with margin 0.2 reads numerical. Batches of copies
    (where no composition bug acts) showed levels of at most 1e-2 and changes of at most 5e-2:
    with their cuts every prompt stands out and the divergence is suspect."""
    moved = [shared(i, 0.1, 0.5) for i in range(7)]
    diverged = Evidence(7, 20, 20, "token", divergence=12, prefix_tokens=10, prefix_median=0.1, prefix_max=0.5)
    diverged.gap_a = 0.2
    blind = estimate_noise([*moved, diverged])
    assert blind.outliers == frozenset() and blind.estimate == pytest.approx(0.5)
    assert decide(diverged, blind)[0] == "numerical"
    calibrated = estimate_noise([*moved, diverged], batch=(-2.0, math.log10(5e-2)))
    assert (7, 0) in calibrated.outliers and len(calibrated.outliers) == 8
    verdict, reason = decide(diverged, calibrated)
    assert verdict == "suspect" and "stands out" in reason
