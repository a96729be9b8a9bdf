"""The probe's pure new parts on hand-built data: placeholder detection, telemetry adapters (and
their refusals of unbelievable values), acceptance intervals and the collapse rule, the scans of
side B, noise by path and its calibration, and the report's versions and schema."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specviz.probe import report as rp
from specviz.probe import report_read as rr
from specviz.probe import report_schema
from specviz.probe import telemetry as tm
from specviz.probe.attribution import Calibration, decide, estimate_noise
from specviz.probe.compare import Evidence
from specviz.probe.responses import parse_answer
from specviz.probe.scans import loop_period, scan

ROOT = Path(__file__).resolve().parents[2]


def _content(*items: dict) -> dict:
    return {"choices": [{"text": "x", "logprobs": {"content": list(items)}}]}


def test_placeholders_are_zero_logprobs_without_alternatives_or_marked() -> None:
    answer = parse_answer(
        _content(
            {"token": " a", "logprob": 0.0, "top_logprobs": []},  # llama-server's drafted token
            {"token": " b", "logprob": 0.0, "top_logprobs": [{"token": " b", "logprob": 0.0}]},  # only itself
            {
                "token": " c",
                "logprob": 0.0,
                "top_logprobs": [{"token": " c", "logprob": 0.0}, {"token": " d", "logprob": -20.0}],
            },  # certain, real
            {"token": " e", "logprob": -0.5, "draft": True, "top_logprobs": []},  # a server's marker
            {"token": " f", "logprob": -0.5, "top_logprobs": []},  # real logprob, no top list
        ),  # fmt: skip
        "completions",
    )
    assert [t.placeholder for t in answer.tokens] == [True, True, False, True, False]
    assert answer.placeholders == 3 and answer.tokens[0].logprob is None and answer.tokens[2].logprob == 0.0
    legacy = {"choices": [{"text": "ab", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [0.0, -1.0],
                                                       "top_logprobs": [None, {"b": -1.0, "c": -2.0}]}}]}  # fmt: skip
    assert [t.placeholder for t in parse_answer(legacy, "completions").tokens] == [True, False]


@pytest.mark.parametrize(
    "payload, expected",
    [
        ({"timings": {"draft_n": 10, "draft_n_accepted": 7, "predicted_n": 16}}, ("llama.cpp", 10, 7, 9)),
        (
            {
                "metrics": {
                    "speculative_decoding": {"num_draft_tokens": 8, "num_accepted_draft_tokens": 2, "num_spec_steps": 4}
                }
            },
            ("vllm", 8, 2, 4),
        ),  # fmt: skip
        ({"meta_info": {"spec_verify_ct": 5, "completion_tokens": 12}}, ("sglang", None, 7, 5)),
        ({"choices": [{"meta_info": {"spec_verify_ct": 4, "completion_tokens": 4}}]}, ("sglang", None, 0, 4)),
    ],
)
def test_each_adapter_reads_its_server(payload: dict, expected: tuple) -> None:
    name, drafting, error = tm.read_response(payload)
    assert error is None and (name, drafting.drafted, drafting.accepted, drafting.steps) == expected


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"timings": {"draft_n": "10"}}, "timings.draft_n is not a number"),
        ({"timings": {"draft_n": -1}}, "out of range"),
        ({"timings": {"draft_n": math.nan}}, "not a whole number"),
        ({"timings": {"draft_n": 3, "draft_n_accepted": 4}}, "4 accepted of 3 drafted"),
        ({"timings": {"draft_n": True}}, "not a number"),
        ({"meta_info": {"spec_verify_ct": 10**15}}, "out of range"),
        ({"metrics": {"speculative_decoding": {"num_draft_tokens": 1}}}, "num_accepted_draft_tokens is not"),
    ],
)
def test_unbelievable_telemetry_is_one_line(payload: dict, message: str) -> None:
    _, drafting, error = tm.read_response(payload)
    assert drafting is None and message in error and "\n" not in error


def test_paths_the_server_reports() -> None:
    from specviz.probe.compare import path_of

    plain = parse_answer({"choices": [{"text": "a"}]}, "completions")
    cached = parse_answer({"choices": [{"text": "a"}], "usage": {"prompt_tokens_details": {"cached_tokens": 12}}},
                          "completions")  # fmt: skip
    drafted = parse_answer({"choices": [{"text": "a"}], "timings": {"draft_n": 4, "draft_n_accepted": 3,
                                                                     "cache_n": 0}}, "completions")  # fmt: skip
    junk = parse_answer({"choices": [{"text": "a"}], "timings": {"cache_n": "lots"}}, "completions")
    assert path_of(plain, plain) == "plain" and path_of(plain, cached) == "plain+cached"
    assert path_of(drafted, plain) == "drafted" and path_of(junk, plain) == "plain"


def test_prometheus_deltas_and_their_refusals() -> None:
    text = (
        '# HELP x\nvllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 100.0\n'
        'vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="1"} 20\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 60\nvllm:spec_decode_num_drafts_total 30\n'
        "vllm:other_total 5\n"
    )
    before = tm.parse_prometheus(text)
    after = dict(before, **{"vllm:spec_decode_num_draft_tokens_total": 160.0,
                            "vllm:spec_decode_num_accepted_tokens_total": 90.0,
                            "vllm:spec_decode_num_drafts_total": 40.0})  # fmt: skip
    assert before["vllm:spec_decode_num_draft_tokens_total"] == 120.0  # summed over engines
    delta = tm.prometheus_delta(before, after)
    assert (delta.drafted, delta.accepted, delta.drafts) == (40, 30, 10)
    assert tm.aggregate_rate(delta).mean_length == pytest.approx(1 + 30 / 10)
    with pytest.raises(tm.TelemetryError, match="went down"):
        tm.prometheus_delta(after, before)
    with pytest.raises(tm.TelemetryError, match="out of range"):
        tm.parse_prometheus("vllm:spec_decode_num_drafts_total -3\n")
    assert tm.prometheus_delta({}, {}) is None


def test_acceptance_interval_and_the_collapse_rule() -> None:
    """The oracle: the Wilson interval by its formula, and a ratio over requests."""
    low, high = tm.wilson(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    healthy = tm.per_request_rate([tm.Drafting(10, 9), tm.Drafting(10, 8), tm.Drafting(20, 18)])
    assert healthy.rate == pytest.approx(35 / 40) and healthy.low < healthy.rate < healthy.high
    fallen = tm.per_request_rate([tm.Drafting(10, 1), tm.Drafting(10, 0), tm.Drafting(20, 2)])
    slightly = tm.per_request_rate([tm.Drafting(10, 8), tm.Drafting(10, 9), tm.Drafting(20, 17)])
    assert tm.collapsed(healthy, fallen) and not tm.collapsed(healthy, slightly)
    assert not tm.collapsed(healthy, None) and not tm.collapsed(None, fallen)
    long = tm.per_request_rate([tm.Drafting(None, None, 4, 16), tm.Drafting(None, None, 5, 19)])
    short = tm.per_request_rate([tm.Drafting(None, None, 14, 16), tm.Drafting(None, None, 17, 19)])
    assert long.rate is None and long.mean_length == pytest.approx(35 / 9)
    assert tm.collapsed(long, short) and not tm.collapsed(short, long)


def test_scans_flag_what_side_b_has_and_a_lacks() -> None:
    assert scan("Q", "an answer", "an answer <|endoftext|> more")[0][0] == "special"
    assert scan("Q <|endoftext|>", "x", "x <|endoftext|>") == ()  # the prompt has it: not a leak
    assert scan("Q", "the cat sat", "the cat sat кошка сидит")[0][0] == "script"
    assert scan("кот", "the cat", "the cat кошка") == ()  # the prompt's own script
    assert loop_period("intro " + "la la " * 5) == 3 and loop_period("no loop here at all") is None
    assert scan("Q", "fine ending", "fine " + "and so on " * 4)[0][0] == "loop"
    assert scan("Q", "and so on " * 4, "and so on " * 5) == ()  # A loops too


def test_decisive_findings_make_a_prompt_suspect_a_loop_does_not() -> None:
    noise = estimate_noise([])
    leak = Evidence(0, 5, 5, "token", divergence=2, gap_a=1e-9, findings=(("special", "'</s>' in side B's text"),))
    looped = Evidence(1, 5, 5, "token", divergence=2, gap_a=1e-9, findings=(("loop", "side B ends in a loop"),))
    assert decide(leak, noise)[0] == "suspect" and decide(looped, noise)[0] == "numerical"


def _ev(index: int, level: float, path: str = "plain") -> Evidence:
    return Evidence(index, 20, 20, "token", prefix_tokens=20, prefix_median=level, prefix_max=level, path=path)


def test_a_path_of_noisier_prompts_neither_stands_out_nor_lends_its_noise() -> None:
    """12 plain prompts at 1e-4, 12 drafted ones at 1e-1 (the server's other kernels): pooled, the
    drafted half stands out; by path, none does and each path keeps its own noise."""
    evs = [_ev(i, 1e-4) for i in range(12)] + [_ev(12 + i, 1e-1, "drafted") for i in range(12)]
    noise = estimate_noise(evs)
    assert not noise.outliers
    assert noise.on("plain").estimate == pytest.approx(1e-4) and noise.on("drafted").estimate == pytest.approx(1e-1)
    pooled = estimate_noise([_ev(e.index, e.prefix_median) for e in evs])
    assert len(pooled.outliers) == 12
    flip = Evidence(3, 20, 20, "token", divergence=5, prefix_median=1e-4, prefix_max=1e-4, gap_a=1e-2)
    assert decide(flip, noise)[0] == "suspect"  # a plain prompt is held to the plain path's noise


def test_calibration_sets_the_least_a_prompt_must_move() -> None:
    evs = [_ev(i, 1e-4) for i in range(7)] + [_ev(7, 1e-2)]
    assert estimate_noise(evs).outliers == frozenset({(7, 0)})
    calibrated = estimate_noise(evs, Calibration("side A sent again", 8, 2e-2, 2e-2))
    assert not calibrated.outliers and calibrated.estimate == pytest.approx(2e-2)


def test_resolution_keeps_one_step_moves_from_standing_out() -> None:
    evs = [_ev(i, 0.0) for i in range(7)] + [_ev(7, 0.03125)]
    assert estimate_noise(evs).outliers == frozenset({(7, 0)})
    for e in evs:
        e.resolution = 0.03125
    assert not estimate_noise(evs).outliers


def _as_version_1(data: dict) -> dict:
    """`data` with every version-2 field removed (the fields that have defaults), as version 1."""
    for name, section in (("side_a", rp.Side), ("side_b", rp.Side), ("noise", rp.Noise)):
        for field, _, optional in rr.fields_of(section):
            if optional:
                data[name].pop(field, None)
    for p in data["prompts"]:
        for field, _, optional in rr.fields_of(rp.PromptResult):
            if optional:
                p.pop(field, None)
    for field, _, optional in rr.fields_of(rp.ProbeReport):
        if optional:
            data.pop(field, None)
    return dict(data, version=1)


def test_version_1_reports_read_and_the_current_version_needs_its_fields(tmp_path: Path) -> None:
    old = _as_version_1(json.loads((ROOT / "traces" / "probe-sweep.json").read_text()))
    assert "levels" not in old and "findings" not in old["prompts"][0] and "cut_max" not in old["noise"]
    report = rr.parse_report(old)
    assert report.rounds == 1 and report.levels == () and report.side_b.placeholders == 0
    new = dict(rp.to_dict(report), version=rp.VERSION)
    new["side_b"].pop("placeholders")
    with pytest.raises(rp.ReportError, match=r"side_b.placeholders: missing"):
        rr.parse_report(new)
    new = rp.to_dict(report)
    new["noise"]["source"] = "<img src=x>"
    with pytest.raises(rp.ReportError, match="noise.source"):
        rr.parse_report(new)
    v2 = json.loads((ROOT / "traces" / "probe-sweep.json").read_text())  # a version-2 file: the pairs default
    assert v2["version"] == 2 and rr.parse_report(v2).noise.pairs == ()


def test_the_schema_file_is_the_generated_schema() -> None:
    """docs/probe.schema.json is written by `python -m specviz.probe.report`; they must agree."""
    assert json.loads((ROOT / "docs" / "probe.schema.json").read_text()) == report_schema.json_schema()
