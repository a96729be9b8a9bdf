"""Acceptance counts of verify steps, and the rates read off them (definitions in
docs/forensics.md#metrics, matching vLLM and llama.cpp): the rate, the mean acceptance length,
per-position acceptance and acceptance given the previous depth, from one histogram."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Acceptance:
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    histogram: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_length(self) -> float | None:
        return 1 + self.accepted / self.verify_steps if self.verify_steps else None

    def _reached(self) -> list[int]:
        """Verify steps that accepted at least i drafts, for i = 0..len(histogram) - 1."""
        reached, running = [], 0
        for count in reversed(self.histogram):
            running += count
            reached.append(running)
        return list(reversed(reached))

    @property
    def per_position(self) -> list[float]:
        if not self.verify_steps:
            return []
        return [count / self.verify_steps for count in self._reached()[1:]]

    @property
    def per_position_given_previous(self) -> list[float | None]:
        """Per depth i, P(accepted >= i+1 | accepted >= i); None where no verify reached depth i.

        A bug that corrupts only the later draft calls (state reused across draft steps) leaves
        depth 0 alone and drops these from depth 1 on, where `per_position`'s running product
        smears the drop over every later depth."""
        if not self.verify_steps:
            return []
        reached = self._reached()
        return [reached[i + 1] / reached[i] if reached[i] else None for i in range(len(reached) - 1)]

    def add(self, accepted: int, k: int, drafted: int | None = None) -> None:
        """One verify of `drafted` drafts (default k; engines may draft fewer), k the run's maximum."""
        drafted = k if drafted is None else drafted
        if len(self.histogram) < k + 1:
            self.histogram.extend([0] * (k + 1 - len(self.histogram)))
        self.verify_steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.histogram[min(accepted, k)] += 1

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            rate=self.rate,
            mean_length=self.mean_length,
            per_position=self.per_position,
            per_position_given_previous=self.per_position_given_previous,
        )
        return out
