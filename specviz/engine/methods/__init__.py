"""Methods: how a run batches its sequences around the shared step (`specviz.engine.step`).

- `eqspec`: static batches realigned (left-padded anew) every step; with k = 0, the baseline;
- `exspec`: a pool of per-sequence caches, batched by equal length when possible (`grouping`);
- `inplace`: static batches in fixed per-row cache regions, nothing moves (`kv/regions.py`).
EQSPEC and INPLACE share one static-batch loop (`static.run_static`), each supplying its prefill
and plan-applying hooks. `METHODS` maps each method name of the trace schema to its `Method`.
"""

from __future__ import annotations

from specviz.engine.methods import eqspec, exspec, inplace
from specviz.engine.methods.base import Method

METHODS: dict[str, Method] = {
    "baseline": eqspec.METHOD,
    "eqspec": eqspec.METHOD,
    "exspec": exspec.METHOD,
    "inplace": inplace.METHOD,
}
