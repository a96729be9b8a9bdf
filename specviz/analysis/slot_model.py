"""What slot forensics produce: each verify step as rows of physical slots (`StepSlots`,
`RowSlots`, `Slot`), what a correct engine would have fed a row (`ExpectedRow`), and the slot
kinds a legend lists. `slots.py` builds them from a trace step; the views draw them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from specviz.analysis.report import Violation
from specviz.trace.schema import RowRecord, StepRecord

# What a physical slot holds, in the order a legend lists them.
SLOT_KINDS: tuple[str, ...] = (
    "padding",  # masked slot before the row's first token
    "prompt",  # cached prompt token
    "committed",  # cached token generated in an earlier step
    "pending",  # query slot 0: fed this step, its KV is computed now
    "accepted",  # draft accepted by verification
    "rejected",  # draft rejected (normal speculative behaviour)
    "bonus",  # the target's own next token, fed next step as the pending one
    "hole",  # masked slot inside the row
    "extra",  # attended slot beyond the row's committed tokens
    "empty",  # no token (short mask, no bonus)
)


@dataclass
class Slot:
    col: int  # 0..cache_len-1 cache, then query slots, then the bonus slot
    kind: str  # one of SLOT_KINDS
    token: int | None = None
    token_index: int | None = None  # index in prompt + output of the row's sequence
    fed_position: int | None = None
    expected_position: int | None = None
    position_recorded: bool = True  # False for prefilled prompt tokens (not in the trace)
    reasons: list[str] = field(default_factory=list)  # why this slot differs from expected

    @property
    def flagged(self) -> bool:
        return bool(self.reasons)


@dataclass
class ExpectedRow:
    """What a correct left-padded engine feeds a row whose sequence holds n committed tokens."""

    left_pad: int
    kv_len: int  # attended cache slots: n - 1
    position_ids: list[int]  # [n - 1, ..., n - 1 + query_len - 1]
    write_seq: int


@dataclass
class RowSlots:
    row: int
    seq_id: int
    committed_before: int
    accepted: int
    slots: SlotList
    violations: list[Violation]
    notes: list[str]  # row-level facts that have no slot (e.g. KV of missing tokens)
    expected: ExpectedRow
    record: RowRecord
    # The column each violation was anchored to when it was placed, parallel to `violations`.
    # Kept, not recomputed: a later violation's mark must not move an earlier one's.
    anchors: list[int] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return bool(self.violations) or any(s.flagged for s in self.slots)

    def kinds(self) -> list[str]:
        return [s.kind for s in self.slots]


@dataclass
class StepSlots:
    step_index: int
    step: StepRecord
    rows: list[RowSlots]
    first_violation: tuple[int, int] | None  # (row, col) of the run's first violation, if in this step

    @property
    def cache_len(self) -> int:
        return self.step.cache_len

    @property
    def query_len(self) -> int:
        return self.step.query_len

    @property
    def width(self) -> int:
        return self.cache_len + self.query_len + 1  # + bonus slot

    def row_position(self, row: int) -> int | None:
        """Index in `rows` of batch row `row` (its line in a drawing), None when the step lacks it."""
        return next((i for i, r in enumerate(self.rows) if r.row == row), None)

    def find_row(self, row: int) -> RowSlots | None:
        position = self.row_position(row)
        return None if position is None else self.rows[position]

    def row(self, row: int) -> RowSlots:
        found = self.find_row(row)
        if found is None:
            raise KeyError(f"step {self.step.step} has no batch row {row}")
        return found


class SlotList:
    """A row's slots by column, built only from column `first` on (the cache left of it is never drawn).

    `len` is the full width and `slots[col]` works for any column (an unbuilt one comes back as an
    empty slot); iteration and slices give the built slots only, so scanning a row for flagged
    slots costs what is drawn, not what the file declares.
    """

    def __init__(self, first: int, built: list[Slot]) -> None:
        self.first = first
        self.built = built

    def __len__(self) -> int:
        return self.first + len(self.built)

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.built)

    def __getitem__(self, key: int | slice) -> Slot | list[Slot]:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise ValueError("SlotList slices take no step")
            return self.built[max(start - self.first, 0) : max(stop - self.first, 0)]
        col = key + len(self) if key < 0 else key
        if not 0 <= col < len(self):
            raise IndexError(f"slot {key} outside 0..{len(self) - 1}")
        return self.built[col - self.first] if col >= self.first else Slot(col, "empty")

    def append(self, slot: Slot) -> None:
        self.built.append(slot)

    def __iadd__(self, slots: list[Slot]) -> SlotList:
        self.built += slots
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SlotList):
            return (self.first, self.built) == (other.first, other.built)
        return isinstance(other, list) and self.first == 0 and self.built == other
