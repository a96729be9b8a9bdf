"""KV caches: their layouts, and the moves that rebuild them after a verify step.

Terms, pinned once (every module of the engine uses them in this sense only):

- **slot**: a physical index into a cache's sequence dimension ([B, H, slot, D]). Slots hold
  padding, committed tokens' KV, or stale KV (rejected drafts) that no mask covers.
- **logical index**: a token's index in its own sequence (0 = the first prompt token); a correct
  engine feeds it as the token's **position** ID. In the left-padded layout slot = left pad +
  logical index; in the fixed-region layout slot = logical index.
- **width**: the slots a cache holds for every row, padding included (`KVState.width`).
- **headroom**: free slots allocated past a cache's width, where the next forwards write in place
  (`headroom.py`); never attended, never part of the width.
- **region**: the fixed run of slots one row owns in the fixed-region layout (`regions.py`).
- **row**: a batch row; **pool row**: a row of EXSPEC's persistent pool (`pool.py`), which holds
  one sequence for its whole life (`KVPool.row_indices` maps sequences to pool rows).
- **left pad**: the unattended slots before a row's first attended one (left-padded layout).

Modules: `state` (the ragged state: mask, next positions, `feed`), `moves` (`compact`, `stack`,
`split`), `headroom`, `window` (per-row sliding-window masks), `pool` and `placement` (EXSPEC),
`regions` (INPLACE's fixed-region layout), `content` (the KV-content check).
"""
