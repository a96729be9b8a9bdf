"""A shared link is a visitor's input: any query string opens the page with its runs. A value the
page never writes (a sign, a Unicode digit, a huge number, an empty or repeated key) is ignored and
named in the slot's status line, never an error (issue 43, attack 2: `?step=--1` and `?step=²`
raised in `int()` and left both slots empty)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import QueryParams

import app
from specviz.app import share

HOSTILE_NUMBERS = (
    "--1", "-1", "+1", "- 1", " 1", "1 ", "²", "٣", "１", "1e3", "0x10", "1_000", "9" * 400, "99999999999",
    "", "\x00", "1\n2", "NaN", "inf", "-0", "0.5", "<script>", "١٢",
)  # fmt: skip
# The grammar: a key (the page's own, or another), and a value from the hostile ones or any text.
KEYS = st.sampled_from(("step", "row", "slot", "tab", "trace", "x"))
VALUES = st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.text(max_size=40), st.integers().map(str))
QUERY = st.lists(st.tuples(KEYS, VALUES), max_size=8)


@given(QUERY)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_any_query_string_parses_to_checked_values(pairs: list[tuple[str, str]]) -> None:
    link = share.LinkState.from_params(QueryParams(pairs))
    for number in (link.step, link.row):
        assert number is None or (type(number) is int and 0 <= number < 10**9)
    assert link.slot in ("A", "B") and link.tab in (None, *share.TABS)
    assert set(link.ignored) <= {"step", "row", "slot", "tab", "trace"}


@pytest.mark.parametrize("value", HOSTILE_NUMBERS)
def test_a_malformed_number_is_ignored_and_named(value: str) -> None:
    link = share.LinkState.from_params(QueryParams([("step", value), ("row", value)]))
    assert (link.step, link.row) == (None, None)
    assert link.ignored == ("step", "row") and "step, row ignored" in link.ignored_note()


def test_repeated_keys_with_two_values_are_ignored_one_value_kept() -> None:
    link = share.LinkState.from_params(QueryParams("step=1&step=2&row=3&row=3&tab=kv"))
    assert (link.step, link.row, link.tab, link.ignored) == (None, 3, "kv", ("step",))
    assert share.LinkState.from_params(QueryParams("step=7&row=0")).ignored == ()


@pytest.fixture(scope="module")
def preload() -> Iterator[Any]:
    demo = app.build_app()
    try:
        yield next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "preload")
    finally:
        demo.close()


@pytest.mark.parametrize(
    "query", ["step=--1", "step=²", "row=--3", "step=1&step=2", "step=&row=", "step=" + "9" * 400, "slot=b&row=١"]
)
def test_the_page_opens_its_runs_on_any_link(preload: Any, query: str) -> None:
    request = types.SimpleNamespace(query_params=QueryParams(query), session_hash="visitor")
    values = preload(40, False, request=request)
    runs = [v for v in values.values() if type(v).__name__ == "LoadedRun"]
    assert len(runs) == 2  # both slots hold their runs
    statuses = [v for v in values.values() if isinstance(v, dict) and "ignored" in str(v.get("value", ""))]
    assert statuses and all("⚠️" in s["value"] for s in statuses)  # the one status line says what was ignored
