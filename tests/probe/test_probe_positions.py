"""Acceptance per draft position (specviz.probe.positions): read from vLLM's Prometheus counters
and SGLang's per-request histogram, with a conditional rate per depth, and a collapse at one depth
under concurrency judged on intervals, not point estimates. The oracle for the server tests is how
tests/support/probe_server.py drafts: seeded draws per prompt and position (the same alone and
batched), and with `+deep` positions 1 and after accept far less once requests share a batch."""

from __future__ import annotations

import json

import pytest

from specviz.cli import main
from specviz.probe import positions, telemetry
from specviz.probe import report as rp

ARGS = ["--num-prompts", "6", "--max-tokens", "16", "--quiet", "--retries", "0", "--concurrency", "1,4"]


def acceptance(rounds: int, accepted: list[int], unreadable: str | None = None) -> rp.Acceptance:
    drafted = rounds * len(accepted)
    rate = sum(accepted) / drafted
    low, high = telemetry.wilson(sum(accepted), drafted)
    by_position = positions.rates(rounds, accepted)
    return rp.Acceptance("prometheus", 0, drafted, sum(accepted), rate, low, high, None, unreadable, by_position)


def test_rates_per_position_and_given_the_one_before():
    rates = positions.rates(100, [80, 40, 10])
    assert [r.rate for r in rates] == [0.8, 0.4, 0.1]
    assert [r.given for r in rates] == [100, 80, 40]
    assert [r.conditional for r in rates] == [0.8, 0.5, 0.25]
    assert all(r.low < r.rate < r.high and r.conditional_low < r.conditional < r.conditional_high for r in rates)
    assert positions.rates(0, [0, 0]) == ()
    zero = positions.rates(10, [0, 0])[1]  # nothing reached position 1: no conditional rate
    assert zero.conditional is None and zero.given == 0


def test_sglang_histogram_and_prometheus_labels_give_the_same_counts():
    # H[n]: rounds that accepted exactly n drafts -> accepted through position i = sum H[n > i]
    assert telemetry.from_histogram([2, 3, 0, 5], "h") == (10, (8, 5, 5))
    with pytest.raises(telemetry.TelemetryError, match="h\\[1\\]"):
        telemetry.from_histogram([1, -2], "h")
    with pytest.raises(telemetry.TelemetryError):
        telemetry.from_histogram("many", "h")
    text = (
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 18.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 5.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 5.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="0"} 1.7e9\n'
    )
    before = telemetry.parse_prometheus(text.replace(" 10.0", " 0.0").replace(" 8.0", " 0.0").replace(" 5.0", " 0.0"))
    delta = telemetry.prometheus_delta(before, telemetry.parse_prometheus(text))
    assert (delta.drafts, delta.positions) == (10, (8, 5, 5))
    sglang = telemetry.read_sglang({"meta_info": {"spec_verify_ct": 10, "spec_accept_histogram": [2, 3, 0, 5]}})
    assert positions.of([sglang]) == positions.of([delta])


def test_counters_that_contradict_each_other_are_unreadable():
    before = {"vllm:spec_decode_num_draft_tokens_total": 0.0, "vllm:spec_decode_num_drafts_total": 0.0}
    before[telemetry.position_key(0)] = 0.0
    after = dict(before, **{"vllm:spec_decode_num_drafts_total": 2.0, telemetry.position_key(0): 3.0})
    with pytest.raises(telemetry.TelemetryError, match="draft position"):
        telemetry.prometheus_delta(before, after)


def test_a_collapse_at_one_depth_is_found_where_the_overall_rate_holds():
    alone = acceptance(1000, [900, 810, 729])
    batched = acceptance(1000, [900, 810, 526])  # position 2 given 1: 0.90 -> 0.65
    assert not positions.rate_collapsed(alone, batched)  # overall 0.81 -> 0.75: no finding of its own
    found = positions.collapse(alone, batched)
    assert found is not None and found.position == 2
    assert "draft position 2 given position 1: 0.90" in positions.describe(alone, found, 8)
    assert positions.collapse(alone, acceptance(1000, [900, 810, 729], unreadable="went down")) is None


@pytest.mark.parametrize(
    "rounds, batched",
    [
        (1000, [890, 795, 700]),  # a few points lower everywhere: noise, intervals overlap
        (12, [11, 10, 3]),  # a deep drop on 12 rounds: too few drafts to say so
    ],
)
def test_noise_and_thin_evidence_are_not_a_collapse(rounds, batched):
    alone = acceptance(rounds, [round(rounds * p) for p in (0.9, 0.81, 0.729)])
    assert positions.collapse(alone, acceptance(rounds, batched)) is None


def probe(capsys, url: str) -> tuple[int, dict, str]:
    status = main(["probe", url, *ARGS, "--json"])
    out = capsys.readouterr().out
    status_text = main(["probe", url, *ARGS])
    return status, json.loads(out), capsys.readouterr().out if status_text == status else "exit status differs"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789-never-written")  # the server's key (conftest)


@pytest.mark.parametrize("style", ["vllm", "sglang"])
def test_a_deep_collapse_under_concurrency_names_its_position(server, capsys, style):
    status, report, text = probe(capsys, f"{server}/identical+spec+deep+{style}/legacy/v1")
    assert report["verdict"] == "identical" and status == 1, report["levels"]
    collapse = report["collapse"]
    assert collapse["concurrency"] == 4 and collapse["position"] == 1, collapse
    one, four = (v["acceptance"]["positions"] for v in report["levels"])
    assert abs(one[0]["conditional"] - four[0]["conditional"]) < 0.15  # position 0 held
    assert four[1]["conditional_high"] < one[1]["conditional_low"]
    assert "acceptance per draft position" in text and "ACCEPTANCE COLLAPSE" in text


def test_healthy_drafting_shows_positions_and_no_collapse(server, capsys):
    status, report, text = probe(capsys, f"{server}/identical+spec+vllm/legacy/v1")
    assert status == 0 and report["collapse"] is None
    one, four = (v["acceptance"]["positions"] for v in report["levels"])
    assert [p["accepted"] for p in one] == [p["accepted"] for p in four]  # seeded draws: the same alone and batched
    assert len(one) == 4 and one[0]["rate"] >= one[1]["rate"] >= one[2]["rate"]
    assert "pos 1" in text and "given 0" in text
