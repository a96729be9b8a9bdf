"""Where each token's KV was computed, for a Parquet trace too big to hold as records.

`slots.fed_history` walks every step's records into one dict, O(row-steps) Python objects. Here
one walk reads five columns a row group at a time (`step`, `seq_id`, `committed_before`,
`accepted`, `position_ids`) into flat arrays, sorted by (sequence, token index); the grid then
asks for the sequences of the step it draws and gets, from those arrays alone (no row group is
read for it), each token's last entry before that step: all that `fed_position_before` reads.
"""

from __future__ import annotations

import threading

import numpy as np

from specviz.analysis.slots import FedHistory
from specviz.trace.arrow import list_parts, numbers
from specviz.trace.columnar_read import ParquetTrace

_COLUMNS = ["step", "seq_id", "committed_before", "accepted", "position_ids"]


class ColumnarFedHistory:
    """`fed_history` of a Parquet trace as arrays; built on first use (one walk), then kept.

    Entries `[n]`: `seq` seq_id, `index` token index, `step` step index, `position` the fed
    position; sorted by (seq, index), stably, so entries of one token stay in step order.
    """

    def __init__(self, source: ParquetTrace) -> None:
        self.source = source
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        # One reader of `source` at a time: a run opened with `app.py --trace` is every session's,
        # and the app inspects on several threads (its row-group cache is one slot).
        self.lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays) if self._arrays is not None else 0

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        parts: list[tuple[np.ndarray, ...]] = []
        source = self.source
        for group in range(source.num_row_groups):
            table = source._file.read_row_group(group, columns=_COLUMNS, use_threads=False)
            parts.append(_group_entries(table, source.group_starts[group]))
        if parts:
            seq, index, step, position = (np.concatenate(p) for p in zip(*parts))
        else:
            seq = index = step = position = np.zeros(0, dtype=np.int64)
        order = np.lexsort((index, seq))  # stable: one token's entries keep their walk order
        return seq[order], index[order], step[order], position[order]

    def before_step(self, seq_ids: set[int], step_index: int) -> FedHistory:
        """What the slots of step `step_index` read from `fed_history` for these sequences: each
        token's last entry before that step (`fed_position_before` gives the same answer)."""
        if self._arrays is None:
            self._arrays = self._build()
        seq, index, step, position = self._arrays
        wanted = np.array(sorted(seq_ids), dtype=np.int64)
        lo, hi = np.searchsorted(seq, wanted, "left"), np.searchsorted(seq, wanted, "right")
        picked = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)] + [np.zeros(0, np.int64)])
        picked = picked[step[picked] < step_index]
        s, i = seq[picked], index[picked]
        # Entries of one token are adjacent, in step order: its last one is where the next differs.
        last = np.ones(len(picked), dtype=bool)
        last[:-1] = (s[1:] != s[:-1]) | (i[1:] != i[:-1])
        picked = picked[last]
        keys = zip(seq[picked].tolist(), index[picked].tolist())
        # Each value a one-entry tuple, `((step, position),)`: built in C, read like fed_history's list.
        return dict(zip(keys, zip(zip(step[picked].tolist(), position[picked].tolist()))))  # type: ignore[arg-type]


def _group_entries(table, first_step: int) -> tuple[np.ndarray, ...]:
    """One row group's entries: each row-step's kept query slots (pending + accepted drafts)."""
    numbers_of_step = numbers(table.column("step"))
    # Step index of each row-step: the group's first step plus the step number changes before it.
    changes = np.concatenate([[0], np.cumsum(numbers_of_step[1:] != numbers_of_step[:-1])])
    step_index = first_step + changes
    parts = list_parts(table.column("position_ids"))
    if parts is None:  # a null inside a list: the check refuses the file before the grid asks
        raise ValueError("position_ids holds a null value")
    offsets, values = parts
    lengths = offsets[1:] - offsets[:-1]
    accepted = numbers(table.column("accepted"))
    kept = np.minimum(np.maximum(accepted, 0) + 1, lengths)  # as `fed_history`: min(max(a, 0) + 1, len)
    rows = np.repeat(np.arange(len(lengths)), kept)
    j = np.arange(len(rows)) - np.repeat(np.cumsum(kept) - kept, kept)  # slot within its row
    base = numbers(table.column("committed_before")) - 1
    return (
        numbers(table.column("seq_id"))[rows],
        base[rows] + j,
        step_index[rows],
        values[offsets[:-1][rows] + j],
    )
