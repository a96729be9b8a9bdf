"""Named faults: each reproduces one bug that real batch speculative decoding engines shipped.

A fault is a small override of one decision the correct engine makes (`base.Fault`, whose hooks
are listed there), inside one phase of the step (`step.py`). The base class is the correct
engine, so the fixed and faulty paths share all other code. What each fault is about lives on its
class, in one place: `name`, `summary` (what broke), `seen_in` (the real thread), `invariants`
(what catches it, first one first), `default_method` (the method it fires on by default) and
`outputs_exact` (True: outputs stay token-exact, only an invariant catches it); docs/faults.md
adds the signature. By concept:
- `layout`: how a row's cache is rebuilt and which positions its tokens get;
- `rows`: acceptance and write-back bookkeeping;
- `drafting`: the draft's positions, a head's carry, a tree's mask and positions;
- `scheduling`: state carried from one step (or draft call) to the next: the pending token, the
  next step's positions, a per-row offset array, a token-to-row map.
"""

from __future__ import annotations

from specviz.engine.faults.base import POSITIONS_OFF, CacheName, Fault, FaultLog, Forward, SlotPlan
from specviz.engine.faults.drafting import (
    DraftPositions,
    HeadSourceIndex,
    SharedCarry,
    TreeNodePositions,
    TreeSiblingMask,
)
from specviz.engine.faults.layout import (
    ColumnPositions,
    KVRowCopy,
    MaskedHoles,
    MissingBonusKV,
    PadAccumulation,
    StaleKV,
    UniformAdvance,
)
from specviz.engine.faults.rows import ExtraAccept, RequestOrder, RowMixup
from specviz.engine.faults.scheduling import (
    AsyncAhead,
    ChunkBoundaryFeed,
    MidBatchPad,
    PenaltyHistory,
    RiderPosition,
    StaleDraftMap,
    StalePending,
)

__all__ = ["FAULTS", "POSITIONS_OFF", "CacheName", "Fault", "FaultLog", "Forward", "SlotPlan", "make_fault"]

FAULTS: dict[str, type[Fault]] = {
    cls.name: cls
    for cls in (
        UniformAdvance,
        ColumnPositions,
        MaskedHoles,
        PadAccumulation,
        StaleKV,
        ExtraAccept,
        RowMixup,
        MissingBonusKV,
        DraftPositions,
        KVRowCopy,
        RequestOrder,
        HeadSourceIndex,
        SharedCarry,
        TreeSiblingMask,
        TreeNodePositions,
        StalePending,
        AsyncAhead,
        MidBatchPad,
        StaleDraftMap,
        PenaltyHistory,
        ChunkBoundaryFeed,
        RiderPosition,
    )
}


def make_fault(name: str | None) -> Fault:
    if name is None or name == "none":
        return Fault()
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; choose from {', '.join(FAULTS)}")
    return FAULTS[name]()
