"""Property-based fuzzing of trace loading and checking (2,000+ generated cases per run).

Every input either loads or raises TraceError with a one-line message; whatever loads is checked
without raising. The long-running version is tools/fuzz_traces.py.
"""

from __future__ import annotations

import functools
import gzip
import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz.analysis.check import check_trace
from specviz.trace.fuzz import mutate_bytes, mutate_dict
from specviz.trace.io import TraceError, parse_trace_bytes, trace_from_dict, trace_to_json
from specviz.trace.synthetic import synthetic_trace

SETTINGS = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@functools.cache
def valid_text() -> str:
    return trace_to_json(synthetic_trace(6, 3, 3, 10))


def valid_dict() -> dict:
    return json.loads(valid_text())


def _load_and_check(load) -> None:
    try:
        trace = load()
    except TraceError as exc:
        message = str(exc)
        assert message and "\n" not in message
        return
    check_trace(trace)  # must not raise on anything the loader accepted


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 4))
def test_structural_mutations_load_or_raise_trace_error(seed: int, rounds: int) -> None:
    data = mutate_dict(valid_dict(), random.Random(seed), rounds)
    _load_and_check(lambda: trace_from_dict(data))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), compress=st.booleans())
def test_byte_mutations_load_or_raise_trace_error(seed: int, compress: bool) -> None:
    raw = mutate_bytes(valid_text().encode(), random.Random(seed))
    if compress:
        raw = gzip.compress(raw)
    _load_and_check(lambda: parse_trace_bytes(raw, "fuzz"))


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    )
)
def test_arbitrary_json_values(value) -> None:
    _load_and_check(lambda: trace_from_dict(value))
