"""Issue 23: the public Space against a hostile visitor, round two. The piece table and every string
inside the budget, the outputs view reading the table once, fair lanes, the memory ceiling, cleanup
on SIGTERM and at start-up, file errors without paths, uploads owned by their session. The
whole-app measurements are `tools/attack_suite.py --quick`; these are the parts testable in-process.
"""

from __future__ import annotations

import json

import pytest

from specviz.trace.budget import PUBLIC_BUDGET, over_budget
from specviz.trace.io import TraceError, parse_trace_bytes, trace_to_dict
from specviz.trace.synthetic import synthetic_trace
from specviz.trace.token_text import trace_token_ids


def small() -> dict:
    return trace_to_dict(synthetic_trace(4, 2, 2, 6))


def with_pieces(data: dict, ids: list[int]) -> dict:
    data["header"]["token_text"] = {str(i): f"t{i}" for i in ids}
    return data


# ----------------------------------------------------------------------------- the budget


def test_a_piece_table_of_the_ids_in_use_is_accepted() -> None:
    trace = synthetic_trace(4, 2, 2, 6)
    data = with_pieces(trace_to_dict(trace), sorted(trace_token_ids(trace)))
    assert over_budget(data) is None
    assert over_budget(data, PUBLIC_BUDGET) is None


def test_the_piece_table_is_bounded_by_use_vocabulary_and_size() -> None:
    data = small()
    used = max(trace_token_ids(synthetic_trace(4, 2, 2, 6)))
    unused = with_pieces(small(), [used + 1])
    assert "not used anywhere" in over_budget(unused)
    vocab = data["header"]["target"]["vocab_size"]
    beyond = with_pieces(small(), [vocab + 5])
    assert "vocabulary" in over_budget(beyond)
    many = with_pieces(small(), list(range(300_000)))
    assert "piece table entries" in over_budget(many)
    long_text = small()
    long_text["header"]["token_text"] = {"1": "x" * (5 << 20)}
    assert "characters in the piece table" in over_budget(long_text, PUBLIC_BUDGET)
    legacy = small()
    legacy["header"]["options"]["token_text"] = {str(i): "x" for i in range(300_000)}
    assert "piece table entries" in over_budget(legacy)


def test_every_string_and_header_value_counts() -> None:
    prompts = small()
    prompts["sequences"][0]["prompt"] = "x" * (5 << 20)
    assert "characters of text" in over_budget(prompts, PUBLIC_BUDGET)
    options = small()
    options["header"]["options"]["junk"] = [[0]] * 30_000
    assert "values in the header" in over_budget(options, PUBLIC_BUDGET)
    events = small()
    events["header"]["fault_events"] = [{"a": "b"}] * 60_000
    assert "values in the header" in over_budget(events)


def test_uploads_get_the_public_budget_in_public_mode(tmp_path, monkeypatch) -> None:
    from specviz.app import loading

    data = small()
    data["steps"] = data["steps"][:1] * 20_001
    for i, step in enumerate(data["steps"]):
        data["steps"][i] = {**step, "step": i}
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("SPACE_ID", "x/y")
    with pytest.raises(TraceError, match="step count"):
        loading.load_upload(str(path))
    with pytest.raises(TraceError, match="step count"):  # the same file through the bytes reader
        parse_trace_bytes(json.dumps(data).encode(), "x.json", budget=PUBLIC_BUDGET)


def test_outputs_read_the_piece_table_once_per_loaded_run(monkeypatch) -> None:
    from specviz.views import analyse, outputs, slot_outputs_html

    trace = synthetic_trace(16, 4, 2, 6)
    trace.header.token_text = {str(i): f"t{i}" for i in sorted(trace_token_ids(trace))}
    loaded, other = analyse(trace, "a"), analyse(trace, "b")
    calls = []
    monkeypatch.setattr(outputs, "token_texts", lambda t: calls.append(t) or {})
    html = slot_outputs_html(loaded, other, "A", 1, False)
    assert calls == [] and "t" in html  # the loaded runs' tables, never rebuilt per card or column
