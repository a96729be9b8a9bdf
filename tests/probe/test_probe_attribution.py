"""The probe's pure parts on hand-built data: both logprob layouts, the noise estimator, the
verdict rule, the report loader and the divergence map."""

from __future__ import annotations

import json
import random

import pytest

from specviz.probe import report as rp
from specviz.probe import report_read as rr
from specviz.probe.attribution import FLOOR, decide, estimate_noise, run_verdict
from specviz.probe.compare import Evidence, compare
from specviz.probe.responses import Answer, parse_answer

LEGACY = {
    "choices": [
        {
            "text": " Paris.",
            "logprobs": {
                "tokens": [" Paris", "."],
                "token_logprobs": [-0.1, -0.5],
                "top_logprobs": [{" Paris": -0.1, " Lyon": -2.4}, {".": -0.5, "!": -0.6}],
            },
        }
    ]
}
CONTENT = {
    "choices": [
        {
            "text": " Paris.",
            "logprobs": {
                "content": [
                    {
                        "token": " Paris",
                        "logprob": -0.1,
                        "top_logprobs": [{"token": " Lyon", "logprob": -2.4}, {"token": " Paris", "logprob": -0.1}],
                    },  # noqa: E501
                    {
                        "token": ".",
                        "logprob": -0.5,
                        "top_logprobs": [{"token": ".", "logprob": -0.5}, {"token": "!", "logprob": -0.6}],
                    },  # noqa: E501
                ]
            },
        }
    ]
}


def test_both_layouts_parse_alike():
    legacy, content = parse_answer(LEGACY, "completions"), parse_answer(CONTENT, "completions")
    assert legacy == content
    assert legacy.tokens[0].top == ((" Paris", -0.1), (" Lyon", -2.4))  # sorted best first


def test_token_ids_are_preferred():
    payload = {"choices": [{"message": {"content": "ab"}, "logprobs": {"content": [
        {"token": "token_id:7", "logprob": -1.0, "top_logprobs": []}]}}]}  # fmt: skip
    assert parse_answer(payload, "chat").tokens[0].id == 7


def test_compare_finds_the_flip_and_its_swing():
    a = parse_answer(LEGACY, "completions")
    b_payload = json.loads(json.dumps(LEGACY))
    lp = b_payload["choices"][0]["logprobs"]
    lp["tokens"][1], lp["token_logprobs"][1] = "!", -0.52
    lp["top_logprobs"][1] = {"!": -0.52, ".": -0.55}
    lp["top_logprobs"][0] = {" Paris": -0.1, " Lyon": -2.3}
    ev = compare(0, a, parse_answer(b_payload, "completions"))
    assert ev.divergence == 1 and ev.token_a.text == "." and ev.token_b.text == "!"
    assert ev.gap_a == pytest.approx(0.1) and ev.gap_b == pytest.approx(0.03)
    assert ev.prefix_tokens == 1 and ev.prefix_max == pytest.approx(0.1)  # margins 2.3 vs 2.2


def test_text_only_answers_compare_by_character():
    ev = compare(0, Answer("abcd", None), Answer("abXd", None))
    assert ev.unit == "char" and ev.divergence == 2 and ev.swing is None


def _evidence(index: int, level: float, rng: random.Random, diverged_swing: float | None = None) -> Evidence:
    ev = Evidence(index, 20, 20, "token")
    ev.prefix_tokens = 10
    ev.prefix_median = level * rng.uniform(0.7, 1.3)
    ev.prefix_max = ev.prefix_median * rng.uniform(2, 4)
    if diverged_swing is not None:
        ev.divergence, ev.gap_a, ev.gap_b = 10, diverged_swing / 2, diverged_swing / 2
    return ev


@pytest.mark.parametrize("level", [1e-5, 1e-2, 0.3])  # float32, bfloat16, 4-bit on CPU
def test_noise_estimate_follows_the_server_not_a_threshold(level):
    rng = random.Random(0)
    evs = [_evidence(i, level, rng, diverged_swing=level if i % 3 == 0 else None) for i in range(30)]
    noise = estimate_noise(evs)
    assert max(level * 1.3 * 4, FLOOR) >= noise.estimate >= max(level, FLOOR)
    assert not noise.outliers
    verdicts = [decide(e, noise)[0] for e in evs]
    assert "suspect" not in verdicts and run_verdict(verdicts) == "numerical"


@pytest.mark.parametrize("hit", [0.2, 0.7])  # a minority, and most rows (all but the longest of each batch)
def test_a_perturbed_subpopulation_stands_out(hit):
    rng = random.Random(1)
    evs = []
    for i in range(40):
        bug = i < int(hit * 40)
        # bug rows: perturbed 100x, and a low-margin flip that a fixed threshold would call numerical
        evs.append(_evidence(i, 1.0 if bug else 1e-2, rng, diverged_swing=0.03 if bug else None))
    noise = estimate_noise(evs)
    assert noise.estimate < 0.1
    assert {e.index for e in evs if e.prefix_median > 0.5} == {i for i, _ in noise.outliers}
    for e in evs:
        verdict, reason = decide(e, noise)
        assert verdict == ("suspect" if e.index < int(hit * 40) else "identical")
        if verdict == "suspect":
            assert "stands out" in reason


def test_big_swing_is_suspect_and_missing_evidence_is_unattributed():
    rng = random.Random(2)
    evs = [_evidence(i, 1e-2, rng) for i in range(10)]
    noise = estimate_noise(evs)
    big = Evidence(99, 5, 5, "token", divergence=0, gap_a=2.0, gap_b=1.0)
    assert decide(big, noise)[0] == "suspect"
    blind = Evidence(98, 5, 5, "token", divergence=0)
    assert decide(blind, noise)[0] == "unattributed"
    bound = Evidence(97, 5, 5, "token", divergence=0, gap_a=1e-3, lower_bound=True)
    assert decide(bound, noise)[0] == "unattributed"
    assert run_verdict(["numerical", "unattributed", "identical"]) == "unattributed"
    assert run_verdict(["unattributed", "suspect"]) == "suspect"
    assert run_verdict([]) == "identical"


# -- the report file ---------------------------------------------------------------------------


def _report() -> rp.ProbeReport:
    prompt = rp.PromptResult(
        index=0, prompt="Q?", verdict="numerical", reason="r", length_a=5, length_b=4, unit="token",
        divergence=3, token_a=rp.TokenView(" a", None, -1.0, -1.01), token_b=rp.TokenView(" the", None, -1.02, -1.0),
        context="x", prefix_tokens=3, prefix_median=0.01, prefix_max=0.02, gap_a=0.02, gap_b=0.01, swing=0.03,
        top_margin_a=0.02, lower_bound=False, stands_out=False, evidence="server", nondeterministic_at=None,
    )  # fmt: skip
    return rp.ProbeReport(
        format=rp.FORMAT, version=rp.VERSION, created="2025-01-01T00:00:00+00:00", verdict="numerical", mode="batch",
        endpoint="completions", max_tokens=5, logprobs=5, repeats=1, replay=None,
        side_a=rp.Side("alone", "http://h:1/v1", "m", 1), side_b=rp.Side("concurrent", "http://h:1/v1", "m", 4),
        counts={"identical": 0, "numerical": 1, "unattributed": 0, "suspect": 0}, nondeterministic=0,
        noise=rp.Noise(0.05, 0.01, 0.01, 0.1, 1, "server"),
        timing=rp.Timing(1.0, 0.99, 0.01, 0.01, 0.02, 0.0, 2), prompts=(prompt,),
    )  # fmt: skip


def test_report_round_trip_and_matrix(tmp_path):
    path = tmp_path / "r.json"
    rp.save_report(_report(), path)
    loaded = rr.load_report(path)
    assert loaded == _report()
    assert [rp.position_kind(loaded.prompts[0], j) for j in range(6)] == [0, 0, 0, 1, 2, -1]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(format="other"), "not a specviz probe report"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d["prompts"][0].update(verdict="fine"), "prompts[0].verdict"),
        (lambda d: d["prompts"][0].pop("swing"), "prompts[0].swing: missing"),
        (lambda d: d["prompts"][0].update(divergence=50), "outside the answers"),
        (lambda d: d["timing"].update(wall_s="1"), "timing.wall_s: expected a finite number"),
    ],
)
def test_loader_refuses_bad_reports_in_one_line(tmp_path, edit, message):
    data = rp.to_dict(_report())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(rp.ReportError) as info:
        rr.load_report(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_loader_size_limit(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(rp.to_dict(_report())))
    monkeypatch.setattr(rr, "MAX_REPORT_BYTES", 100)
    with pytest.raises(rp.ReportError, match="limit"):
        rr.load_report(path)


def test_schema_and_bundled_example_agree():
    import pathlib

    import jsonschema

    root = pathlib.Path(__file__).resolve().parents[2]
    schema = json.loads((root / "docs" / "probe.schema.json").read_text())
    jsonschema.validate(rp.to_dict(_report()), schema)
    example = root / "traces" / "probe-example.json"
    jsonschema.validate(json.loads(example.read_text()), schema)
    assert rr.load_report(example).verdict in rp.VERDICTS
