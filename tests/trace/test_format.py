"""The documented trace format (docs/trace-format.md, docs/trace.schema.json) is the one specviz
writes and reads: real traces validate against the schema, save/load round-trips exactly, the
schema mirrors the dataclasses, the doc's example loads, and malformed files fail with one-line
`TraceError`s that name the field.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import re
import runpy
import types
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from tiny import make_pair

from specviz.engine.run import RunConfig, run
from specviz.trace import schema as trace_schema
from specviz.trace.budget import DEFAULT_BUDGET
from specviz.trace.io import (
    MAX_JSON_BYTES,
    TraceError,
    load_trace,
    parse_trace_bytes,
    save_trace,
    trace_from_dict,
    trace_to_dict,
)
from specviz.trace.schema import SCHEMA_VERSION, Trace

DOCS = Path(__file__).resolve().parents[2] / "docs"
SCHEMA = json.loads((DOCS / "trace.schema.json").read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

PROMPTS = ["hello", "a", "some longer prompt", "ab", "left pad me please"]
CORRECT = ("eqspec", "exspec", "baseline")  # runs without a fault


@pytest.fixture(scope="module")
def format_runs() -> dict[str, Trace]:
    # One thread: on a shared, loaded CPU, tiny models spend most of their time in thread handoff.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pair = make_pair("llama")
        common = {"batch_size": 2, "draft_k": 3, "max_new_tokens": 8}
        return {
            "eqspec": run(pair, PROMPTS, RunConfig(method="eqspec", **common)),
            "exspec": run(pair, PROMPTS, RunConfig(method="exspec", exspec_window=4, **common)),
            "baseline": run(
                pair, PROMPTS, RunConfig(method="baseline", batch_size=2, max_new_tokens=6, reference=False)
            ),
            "column-positions": run(pair, PROMPTS, RunConfig(method="eqspec", fault="column-positions", **common)),
        }
    finally:
        torch.set_num_threads(threads)


def as_json(trace: Trace) -> dict[str, Any]:
    """The dict exactly as it lies in a file (tuples become lists, floats as written)."""
    return json.loads(json.dumps(trace_to_dict(trace), allow_nan=False))


# ----------------------------------------------------------------------------- (a) schema


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("name", ["eqspec", "exspec", "baseline", "column-positions"])
def test_engine_trace_validates_against_schema(format_runs: dict[str, Trace], name: str) -> None:
    data = as_json(format_runs[name])
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(data)]
    assert not errors, errors[:5]
    assert data["steps"], "the run recorded no steps"


def test_traces_cover_the_nullable_and_optional_shapes(format_runs: dict[str, Trace]) -> None:
    """The runs above exercise the variants the schema allows, so validation means something."""
    base = format_runs["baseline"]
    assert base.header.draft is None and base.header.draft_k == 0
    assert all(r.draft_kv_len is None and r.draft_tokens == [] for s in base.steps for r in s.rows)
    assert all(s.reference_ids is None for s in base.sequences)
    ex = format_runs["exspec"]
    assert {s.grouped for s in ex.steps} <= {True, False} and ex.header.options["exspec_window"] == 4
    eq = format_runs["eqspec"]
    rows = [r for s in eq.steps for r in s.rows]
    assert any(r.left_pad_after is None for r in rows) and any(r.left_pad_after is not None for r in rows)
    assert any(r.left_pad > 0 for r in rows)
    assert all(r.draft_kv_len is not None for r in rows)
    assert format_runs["column-positions"].header.fault_events  # written for tests, still valid


def expected_emitted(trace: Trace, row: Any, proposal: list[int]) -> list[int]:
    seq = next(s for s in trace.sequences if s.seq_id == row.seq_id)
    budget = trace.header.max_new_tokens - (row.committed_before - len(seq.prompt_ids))
    out = proposal[: max(0, budget)]
    for i, token in enumerate(out):
        if token in trace.header.eos_token_ids:
            return out[: i + 1]
    return out


def assert_documented_correct_values(trace: Trace) -> None:
    """Every 'correct value' column of docs/trace-format.md, for a trace from a correct engine."""
    h = trace.header
    produced: dict[int, list[int]] = {s.seq_id: [] for s in trace.sequences}
    prompts = {s.seq_id: s.prompt_ids for s in trace.sequences}
    for index, step in enumerate(trace.steps):
        assert step.step == index and step.query_len == h.draft_k + 1
        assert [r.row for r in step.rows] == list(range(len(step.rows)))
        continuing = [r.committed_before + len(r.emitted) - 1 for r in step.rows if not r.finished]
        for r in step.rows:
            n, q, a = r.committed_before, step.query_len, r.accepted
            where = f"step {step.step} row {r.row}"
            assert n == len(prompts[r.seq_id]) + len(produced[r.seq_id]), where
            assert r.pending_token == (prompts[r.seq_id] + produced[r.seq_id])[n - 1], where
            assert r.position_ids == list(range(n - 1, n - 1 + q)), where
            runs = [[0, r.left_pad], [1, step.cache_len - r.left_pad + q]]
            assert r.mask_rle == [run for run in runs if run[1] > 0], where
            assert r.kv_len == r.kv_len_expected == n - 1 == step.cache_len - r.left_pad, where
            assert r.write_seq == r.seq_id, where
            assert len(r.draft_tokens) == h.draft_k and len(r.target_tokens) == q, where
            matched = 0
            while matched < h.draft_k and r.draft_tokens[matched] == r.target_tokens[matched]:
                matched += 1
            assert a == matched, where
            proposal = r.draft_tokens[:a] + [r.target_tokens[a]]
            assert r.emitted == expected_emitted(trace, r, proposal), where
            assert r.bonus == (r.target_tokens[a] if len(r.emitted) == a + 1 else None), where
            if h.draft_k == 0:
                assert r.draft_kv_len is None and r.draft_kv_len_expected is None, where
            elif r.draft_kv_len is not None:  # optional: the doc example leaves it out
                assert r.draft_kv_len == r.draft_kv_len_expected == n - 1, where
            assert r.finished == (r.finish_reason is not None), where
            if r.finished:
                assert r.left_pad_after is None, where
            elif h.method == "exspec":
                assert r.left_pad_after == 0, where
            else:
                assert r.left_pad_after == max(continuing) - (n + len(r.emitted) - 1), where
            produced[r.write_seq].extend(r.emitted)
    for seq in trace.sequences:
        assert seq.output_ids == produced[seq.seq_id], seq.seq_id
        if seq.reference_ids is not None:
            assert seq.reference_margins is not None
            assert len(seq.reference_margins) == len(seq.reference_ids)


@pytest.mark.parametrize("name", CORRECT)
def test_correct_engine_writes_the_documented_values(format_runs: dict[str, Trace], name: str) -> None:
    assert_documented_correct_values(format_runs[name])


def test_doc_example_loads_validates_and_is_correct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DOCS / "trace-format.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "json.dump(" in b]
    assert len(blocks) == 1
    script = tmp_path / "doc_example.py"
    script.write_text(blocks[0], encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="doc_example")
    path = tmp_path / "my-engine.trace.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert not list(VALIDATOR.iter_errors(data))
    trace = load_trace(path)
    assert trace.header.engine == "my-engine" and trace.header.fault_events == []
    assert_documented_correct_values(trace)


# ----------------------------------------------------------------------------- (b) round trip


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_save_load_round_trip(format_runs: dict[str, Trace], tmp_path: Path, suffix: str) -> None:
    for name, trace in format_runs.items():
        path = save_trace(trace, tmp_path / f"{name}{suffix}")
        raw = path.read_bytes()
        assert (raw[:2] == b"\x1f\x8b") == suffix.endswith(".gz")
        loaded = load_trace(path)
        assert loaded == trace, name
        assert trace_to_dict(loaded) == trace_to_dict(trace), name
        assert parse_trace_bytes(raw) == trace, name
    assert not list(tmp_path.glob(".*.tmp")), "atomic write left a temp file"


def test_gzip_is_detected_by_content_not_name(format_runs: dict[str, Trace], tmp_path: Path) -> None:
    trace = format_runs["eqspec"]
    payload = json.dumps(trace_to_dict(trace)).encode()
    (tmp_path / "packed.json").write_bytes(gzip.compress(payload))
    (tmp_path / "plain.json.gz").write_bytes(payload)
    assert load_trace(tmp_path / "packed.json") == trace
    assert load_trace(tmp_path / "plain.json.gz") == trace


def test_optional_fields_may_be_omitted(format_runs: dict[str, Trace]) -> None:
    data = as_json(format_runs["eqspec"])
    defaults = {"engine", "options", "complete", "finished_at", "decode_seconds", "fault_events"}
    for key in defaults:
        del data["header"][key]
    for step in data["steps"]:
        for row in step["rows"]:
            for key in ("draft_kv_len", "draft_kv_len_expected", "finished", "finish_reason"):
                del row[key]
    assert not list(VALIDATOR.iter_errors(data))
    trace = trace_from_dict(data)
    assert trace.header.engine == "specviz" and trace.header.fault_events == []
    assert trace.steps[0].rows[0].draft_kv_len is None and trace.steps[0].rows[0].finished is False


# ----------------------------------------------------------------------------- (c) schema == dataclasses

DATACLASSES = {
    "ModelInfo": trace_schema.ModelInfo,
    "Header": trace_schema.Header,
    "RowRecord": trace_schema.RowRecord,
    "StepRecord": trace_schema.StepRecord,
    "SequenceRecord": trace_schema.SequenceRecord,
}


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        node = SCHEMA["$defs"][ref.removeprefix("#/$defs/")]
    return node


def schema_types(node: dict[str, Any]) -> set[str] | None:
    """JSON types a schema node admits; None for 'anything'."""
    node = resolve(node)
    if "anyOf" in node:
        parts = [schema_types(n) for n in node["anyOf"]]
        return None if None in parts else set().union(*parts)
    if "type" in node:
        return {node["type"]} if isinstance(node["type"], str) else set(node["type"])
    values = node.get("enum", [node["const"]] if "const" in node else None)
    if values is None:
        return None
    return {{type(None): "null", str: "string", int: "integer", bool: "boolean"}[type(v)] for v in values}


def hint_types(hint: Any) -> set[str] | None:
    if hint is Any:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [hint_types(a) for a in typing.get_args(hint)]
        return None if None in parts else set().union(*parts)
    simple = {
        int: "integer",
        float: "number",
        str: "string",
        bool: "boolean",
        type(None): "null",
        list: "array",
        dict: "object",
    }
    if dataclasses.is_dataclass(hint):
        return {"object"}
    return {simple[origin or hint]}


@pytest.mark.parametrize("name", sorted(DATACLASSES))
def test_schema_mirrors_dataclass(name: str) -> None:
    cls = DATACLASSES[name]
    node = SCHEMA["$defs"][name]
    fields = dataclasses.fields(cls)
    assert node["type"] == "object" and node["additionalProperties"] is False
    assert set(node["properties"]) == {f.name for f in fields}
    required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert set(node["required"]) == required
    hints = typing.get_type_hints(cls)
    for f in fields:
        assert schema_types(node["properties"][f.name]) == hint_types(hints[f.name]), f.name
        if f.name not in required:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert node["properties"][f.name].get("default") == default, f.name


def test_schema_top_level_mirrors_trace() -> None:
    fields = {f.name for f in dataclasses.fields(Trace)}
    assert set(SCHEMA["properties"]) == fields | {"format"}
    assert set(SCHEMA["required"]) == fields | {"format"}
    assert SCHEMA["additionalProperties"] is False
    assert SCHEMA["properties"]["format"]["const"] == trace_schema.FORMAT_NAME
    assert SCHEMA["$defs"]["Header"]["properties"]["schema_version"]["const"] == SCHEMA_VERSION


def test_doc_names_every_field() -> None:
    text = (DOCS / "trace-format.md").read_text(encoding="utf-8")
    assert f"schema_version {SCHEMA_VERSION}" in text
    for cls in [*DATACLASSES.values(), Trace]:
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in text, f"{cls.__name__}.{f.name} is not documented"


# ----------------------------------------------------------------------------- (d) load errors


def _row(d: dict) -> dict:
    return d["steps"][0]["rows"][0]


def _set(getter, key, value):
    def mutate(d: dict) -> None:
        getter(d)[key] = value

    return mutate


def _delete(getter, key):
    def mutate(d: dict) -> None:
        del getter(d)[key]

    return mutate


def _header(d: dict) -> dict:
    return d["header"]


def _seq(d: dict) -> dict:
    return d["sequences"][0]


# (mutation, text the message must contain, whether JSON Schema can see the problem too)
STRUCTURAL = {
    "missing field": (_delete(_row, "accepted"), "steps[0].rows[0]: missing field 'accepted'", True),
    "missing header field": (_delete(_header, "method"), "header: missing field 'method'", True),
    "extra field": (_set(_header, "colour", "red"), "header: unknown field 'colour'", True),
    "extra top-level field": (_set(lambda d: d, "extra", 1), "top level: unknown field 'extra'", True),
    "str for int": (_set(_row, "accepted", "3"), "steps[0].rows[0].accepted: expected int, got str", True),
    "float for int": (_set(_row, "kv_len", 4.5), "steps[0].rows[0].kv_len: expected int, got float", True),
    "bool for int": (_set(_seq, "seq_id", True), "sequences[0].seq_id: expected int, got bool", True),
    "null for str": (_set(_seq, "prompt", None), "sequences[0].prompt: expected str, got null", True),
    # A row's plain fields are taken as is when already right (validate's fast path): wrong ones still get named.
    "int for bool": (_set(_row, "finished", 1), "steps[0].rows[0].finished: expected bool, got int", True),
    "null for int": (_set(_row, "accepted", None), "steps[0].rows[0].accepted: expected int, got null", True),
    "bool for optional int": (_set(_row, "bonus", False), "steps[0].rows[0].bonus: expected int, got bool", True),
    "absurd int in a row": (_set(_row, "pending_token", 10**13), "steps[0].rows[0].pending_token: absurd value", True),
    "str in token list": (lambda d: _row(d)["emitted"].append("x"), "steps[0].rows[0].emitted[", True),
    "object for array": (_set(lambda d: d, "steps", {}), "steps: expected array, got object", True),
    "str for float": (_set(lambda d: d["steps"][0], "verify_ms", "1"), "steps[0].verify_ms", True),
    "negative count": (_set(_row, "kv_len", -1), "steps[0].rows[0].kv_len: must be between 0", True),
    "bad mask run": (_set(_row, "mask_rle", [[2, 3]]), "steps[0].rows[0].mask_rle[0]", True),
    "short mask run": (_set(_row, "mask_rle", [[1]]), "steps[0].rows[0].mask_rle[0]", True),
    "bad finish reason": (_set(_row, "finish_reason", "tired"), "steps[0].rows[0].finish_reason", True),
    "batch size 0": (_set(_header, "batch_size", 0), "header.batch_size", True),
    "empty prompt": (_set(_seq, "prompt_ids", []), "sequences[0].prompt_ids: empty prompt", True),
    "null model": (_set(_header, "target", None), "header.target: expected object, got null", True),
    "wrong format": (_set(lambda d: d, "format", "other"), "format: expected 'specviz-trace'", True),
    "newer version": (_set(_header, "schema_version", SCHEMA_VERSION + 1), "upgrade specviz", True),
    "older version": (_set(_header, "schema_version", 0), "re-record it", True),
    "string version": (_set(_header, "schema_version", "1"), "header.schema_version", True),
    "unknown seq_id": (_set(_row, "seq_id", 999), "steps[0].rows[0].seq_id: no sequence with id 999", False),
    "unknown write_seq": (_set(_row, "write_seq", 999), "steps[0].rows[0].write_seq", False),
    "duplicate seq_id": (
        lambda d: d["sequences"].append(copy.deepcopy(d["sequences"][0])),
        "duplicate sequence id",
        False,
    ),
    "margins length": (lambda d: _seq(d)["reference_margins"].pop(), "sequences[0].reference_margins", False),
    # Docs and loader agree: refused as documented.
    "sequence finish reason": (_set(_seq, "finish_reason", "stop"), "sequences[0].finish_reason: unknown reason", True),
    "margins without reference": (
        _set(_seq, "reference_ids", None),
        "sequences[0].reference_margins: present but reference_ids is null",
        True,
    ),
    "step numbers repeat": (
        lambda d: d["steps"][1].__setitem__("step", d["steps"][0]["step"]),
        "steps[1].step: step numbers must increase",
        False,
    ),
    "negative draft kv len": (_set(_row, "draft_kv_lens", [3, -1]), "steps[0].rows[0].draft_kv_lens[1]", True),
}


@pytest.fixture(scope="module")
def small(format_runs: dict[str, Trace]) -> dict[str, Any]:
    return as_json(format_runs["eqspec"])


def assert_one_line_error(path: Path, must_contain: str | tuple[str, ...], upload: bool = False) -> str:
    """A malformed file's one-line error; `upload`: loaded with an upload's limits (a local load
    has no size cap and no budget, so a bomb is refused only there)."""
    limits = {"max_bytes": MAX_JSON_BYTES, "budget": DEFAULT_BUDGET} if upload else {}
    with pytest.raises(TraceError) as info:
        load_trace(path, **limits)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    alternatives = (must_contain,) if isinstance(must_contain, str) else must_contain
    assert any(text in message for text in alternatives), message
    return message


@pytest.mark.parametrize("case", sorted(STRUCTURAL))
def test_malformed_structure_raises_trace_error(small: dict, tmp_path: Path, case: str) -> None:
    mutate, must_contain, schema_sees_it = STRUCTURAL[case]
    data = copy.deepcopy(small)
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert_one_line_error(path, must_contain)
    assert bool(list(VALIDATOR.iter_errors(data))) == schema_sees_it


def _gz(raw: bytes) -> bytes:
    return gzip.compress(raw, mtime=0)


def _corrupt_crc(raw: bytes) -> bytes:
    packed = bytearray(_gz(raw))
    packed[-8] ^= 0xFF
    return bytes(packed)


def _text(small: dict) -> str:
    return json.dumps(small)


BYTES_CASES = {
    "NaN": (lambda s: _text(s).replace('"draft_ms":', '"draft_ms": NaN, "x":', 1).encode(), "NaN"),
    "Infinity": (lambda s: _text(s).replace('"verify_ms":', '"verify_ms": Infinity, "x":', 1).encode(), "Infinity"),
    "overflowing float": (
        lambda s: re.sub(r'"verify_ms": [0-9.e+-]+', '"verify_ms": 1e999', _text(s), count=1).encode(),
        "steps[0].verify_ms: number is not finite",
    ),
    "huge int in float field": (
        lambda s: re.sub(r'"verify_ms": [0-9.e+-]+', '"verify_ms": ' + "9" * 400, _text(s), count=1).encode(),
        "steps[0].verify_ms: number out of range",
    ),
    "int over the digit limit": (
        lambda s: _text(s).replace('"seed": 0', '"seed": ' + "9" * 5000, 1).encode(),
        "JSON number",
    ),
    "absurd int": (
        lambda s: _text(s).replace('"seed": 0', '"seed": ' + "9" * 30, 1).encode(),
        "header.seed: absurd value",
    ),
    "not JSON": (lambda s: b"this is not a trace", "not valid JSON"),
    "empty file": (lambda s: b"", ("not valid JSON", "empty trace file")),
    "truncated JSON": (lambda s: _text(s)[:-50].encode(), "not valid JSON"),
    "top-level array": (lambda s: b"[1, 2, 3]", "top level: expected a JSON object, got array"),
    "deep nesting": (lambda s: b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "non-UTF-8": (lambda s: _text(s).replace('"hello"', '"h\xe9llo"', 1).encode("latin-1"), "not UTF-8"),
    "UTF-8 BOM": (lambda s: b"\xef\xbb\xbf" + _text(s).encode(), "not valid JSON"),
    "truncated gzip": (lambda s: _gz(_text(s).encode())[:-30], "corrupt or truncated gzip"),
    "gzip header only": (lambda s: _gz(_text(s).encode())[:12], "corrupt or truncated gzip"),
    "gzip bad CRC": (lambda s: _corrupt_crc(_text(s).encode()), "corrupt or truncated gzip"),
    "gzip of garbage": (lambda s: _gz(b"\xff\xfe\x00garbage"), "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(BYTES_CASES))
def test_malformed_bytes_raise_trace_error(small: dict, tmp_path: Path, case: str) -> None:
    make, must_contain = BYTES_CASES[case]
    path = tmp_path / "bad.json"
    path.write_bytes(make(small))
    assert_one_line_error(path, must_contain)


def test_decompression_bomb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b" " * (65 * 1024 * 1024), compresslevel=1))
    assert_one_line_error(path, "decompression bomb", upload=True)


def test_missing_path_and_directory(tmp_path: Path) -> None:
    assert_one_line_error(tmp_path / "nope.json", ("no such file", "no such trace file"))
    assert_one_line_error(tmp_path, ("not a file", "not a trace file"))


def test_newer_version_message_is_clear(small: dict) -> None:
    data = copy.deepcopy(small)
    data["header"]["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(
        TraceError,
        match=rf"^t\.json: header\.schema_version: trace is version {SCHEMA_VERSION + 1}, "
        rf"this specviz reads up to {SCHEMA_VERSION}; upgrade specviz$",
    ):
        parse_trace_bytes(json.dumps(data).encode(), "t.json")


# ----------------------------------------------------------------------------- (e) accepted by design


def _finished_row(d: dict) -> dict:
    return next(r for s in d["steps"] for r in s["rows"] if r["finish_reason"] is not None)


def _gap_steps(d: dict) -> None:
    for i, step in enumerate(d["steps"]):
        step["step"] = 3 * i + 1


def _null_bonus(d: dict) -> None:
    row = next(r for s in d["steps"] for r in s["rows"] if r["bonus"] is not None)
    row["bonus"] = None


# (mutation, what `check` then concludes): each is documented in docs/trace-format.md as accepted.
ACCEPTED = {
    "left_pad_after on a finished row": (lambda d: _finished_row(d).__setitem__("left_pad_after", 3), "clean"),
    "no draft model with draft_k > 0": (_set(_header, "draft", None), "clean"),
    "sequences in any order": (lambda d: d["sequences"].reverse(), "clean"),
    "step numbers with gaps": (_gap_steps, "clean"),
    "bonus null although emitted": (_null_bonus, "desync"),  # loads; the checker flags it
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_documented_acceptances_load_and_check(small: dict, case: str) -> None:
    from specviz.analysis.check import check_trace

    mutate, verdict = ACCEPTED[case]
    data = copy.deepcopy(small)
    mutate(data)
    assert not list(VALIDATOR.iter_errors(data))
    report = check_trace(trace_from_dict(data))
    assert report.verdict == verdict, report.first_violation
    if verdict == "desync":
        assert report.first_violation.field == "bonus"


def test_version_1_files_still_load(small: dict) -> None:
    data = copy.deepcopy(small)
    data["header"]["schema_version"] = 1
    trace = trace_from_dict(data)
    assert trace.header.schema_version == 1 and trace.steps[0].rows[0].kv_mismatch_slot is None


def test_version_2_row_fields_round_trip_and_are_written_only_when_recorded(format_runs: dict[str, Trace]) -> None:
    trace = copy.deepcopy(format_runs["eqspec"])
    row = trace.steps[1].rows[0]
    row.query_causal, row.draft_position_ids, row.draft_kv_lens = True, [4, 5, 6], [4, 5, 6]
    row.kv_content_checked, row.kv_mismatch_slot = True, 0  # slot 0 is a value, not "absent"
    data = as_json(trace)
    assert not list(VALIDATOR.iter_errors(data))
    assert trace_from_dict(data) == trace
    written = data["steps"][1]["rows"][0]
    assert written["kv_mismatch_slot"] == 0 and written["kv_content_checked"] is True
    assert "kv_mismatch_slot" not in data["steps"][0]["rows"][0]


@pytest.mark.parametrize("suffix", [".json", ".parquet"])
def test_a_recorded_false_survives_the_file_and_the_check_reads_it(
    format_runs: dict[str, Trace], tmp_path: Path, suffix: str
) -> None:
    """A verify block that was not causal (`query_causal` False, its default None) is a finding: the
    JSON writer once left it out as if unrecorded, and the reloaded trace read no violation."""
    from specviz.analysis.check import check_trace

    trace = copy.deepcopy(format_runs["eqspec"])
    row = trace.steps[1].rows[0]
    row.query_causal = False
    before = check_trace(trace)
    loaded = load_trace(save_trace(trace, tmp_path / f"noncausal{suffix}"))
    assert loaded.steps[1].rows[0].query_causal is False
    after = check_trace(loaded)
    assert before.violation_count > 0 and after.violations == before.violations
    written = [r for step in as_json(trace)["steps"] for r in step["rows"]]
    recorded = [r for step in trace.steps for r in step.rows]
    assert all(("query_causal" in w) == (r.query_causal is not None) for w, r in zip(written, recorded))
