"""What a drafting fault cost: acceptance with the fault against the same run without it.

A head fed the wrong hidden state (`Invariant.HEAD`) can leave every output exact, since the
target verifies each draft: the damage is the acceptance lost, so it is reported as a drafting
fault with that cost, measured against a run of the same prompts and settings without the fault.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.analysis.exactness import exact_match
from specviz.analysis.metrics import acceptance
from specviz.trace.schema import Trace


@dataclass(frozen=True)
class DraftingCost:
    rate_with: float | None  # accepted / drafted, with the fault
    rate_without: float | None
    mean_length_with: float | None  # tokens per row per verify step, with the fault
    mean_length_without: float | None
    exact_with: float | None  # share of sequences equal to the reference, with the fault

    @property
    def rate_lost(self) -> float | None:
        if self.rate_with is None or self.rate_without is None:
            return None
        return self.rate_without - self.rate_with

    def line(self) -> str:
        """One line for a report: the acceptance the fault cost."""
        if self.rate_lost is None:
            return "drafting fault: no drafts to compare"
        return (
            f"drafting fault: acceptance {self.rate_with:.1%} vs {self.rate_without:.1%} without it "
            f"(mean acceptance length {self.mean_length_with:.2f} vs {self.mean_length_without:.2f})"
        )


def drafting_cost(faulty: Trace, clean: Trace) -> DraftingCost:
    """Acceptance of `faulty` against `clean`, a run of the same prompts and settings without the fault."""
    with_fault, _ = acceptance(faulty)
    without, _ = acceptance(clean)
    return DraftingCost(
        rate_with=with_fault.rate,
        rate_without=without.rate,
        mean_length_with=with_fault.mean_length,
        mean_length_without=without.mean_length,
        exact_with=exact_match(faulty),
    )
