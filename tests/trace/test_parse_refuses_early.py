"""A container over the budget is refused while it is parsed, not after (issue 43, attack 9: round
two's piece-table trace, 2.15M entries in 5.6 MB of gzip, was parsed whole, ~2.5 s of CPU and a
~400 MB peak, before the budget refused it; now the parse stops at the budget's count)."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc

import pytest

from specviz.trace.budget import PUBLIC_BUDGET, budget_items
from specviz.trace.io import parse_trace_bytes, trace_to_dict
from specviz.trace.jsonparse import TooMany, loads_yielding
from specviz.trace.synthetic import synthetic_trace
from specviz.trace.validate import TraceError

ENTRIES = 2_150_000  # round two's file


@pytest.fixture(scope="module")
def piece_table_gzip() -> bytes:
    """Round two's trace: a small run whose piece table has 2.15M entries (33 MB of JSON)."""
    data = trace_to_dict(synthetic_trace(4, 2, 4, 8))
    head, tail = json.dumps(data, separators=(",", ":")).split('"token_text":{}', 1)
    table = ",".join(f'"{i}":"t{i % 100}"' for i in range(ENTRIES))
    return gzip.compress(f'{head}"token_text":{{{table}}}{tail}'.encode(), 1)


def test_the_piece_table_trace_is_refused_within_its_budget_of_cpu_and_memory(piece_table_gzip: bytes) -> None:
    tracemalloc.start()
    cpu = time.process_time()
    try:
        with pytest.raises(TraceError, match=r"header\.token_text: more than 262,144 items"):
            parse_trace_bytes(piece_table_gzip, "pieces.json.gz", budget=PUBLIC_BUDGET)
        cpu = time.process_time() - cpu
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The gunzipped bytes and their text are 33 MB each; the whole table's dict was ~300 MB more.
    assert peak < 160 << 20, f"peak {peak >> 20} MB"
    assert cpu < 3.0  # the goal (tracemalloc on: ~2x slower than the app's parse)


def test_every_container_parsed_by_item_is_counted() -> None:
    text = json.dumps({"header": {"token_text": {str(i): "x" for i in range(50)}}, "steps": list(range(60))})
    for limit, where in ((10, "header.token_text"), (55, "steps")):
        with pytest.raises(TooMany, match=rf"^{where}: more than {limit} items"):
            loads_yielding(text, max_items=limit)
    assert loads_yielding(text, max_items=60) == json.loads(text)  # at the limit: read as json reads it
    assert budget_items(PUBLIC_BUDGET) == PUBLIC_BUDGET.max_token_text_entries
