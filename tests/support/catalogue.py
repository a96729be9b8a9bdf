"""The eight faults that reproduce the ragged-batch bugs of docs/faults.md's first table.

Tests that compare two ways of seeing the same run (recorder vs watch, greedy vs sampled) run these;
the later faults (`draft-positions`, `kv-row-copy`) have tests of their own. Imports nothing, so the
watch tests can use it under transformers 4.x too.
"""

ORIGINAL_FAULTS = (
    "uniform-advance",
    "column-positions",
    "masked-holes",
    "pad-accumulation",
    "stale-kv",
    "extra-accept",
    "row-mixup",
    "missing-bonus-kv",
)
