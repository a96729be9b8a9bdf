"""The noise per compute path end to end, on tests/support/probe_server.py built like a quantized
CPU llama-server: `rows` computes a request's multi-token forwards (its prompt) in bfloat16 and its
one-token decode in float32; `verify` drafts and computes every step as a verify chunk (bfloat16)
and returns every token after the first as a placeholder, as llama.cpp's server does.

The oracle is how the server is built: `numerical` changes answers only through rounding, so it
is never suspect; `bug` (positions), `order` (another row's token fed back: a KV mix-up between
rows) and `mask` (another row's attention mask) are real batching bugs, suspect behind placeholders
too. Before the noise per path, the plain-vs-drafting run below was SUSPECT on every run: its only
noise was the first token's, computed identically on both sides (1e-05), and every divergence
happened inside a verify chunk (issue 42)."""

from __future__ import annotations

import json

import pytest

from specviz.cli import main

FAST = ["--num-prompts", "16", "--max-tokens", "16", "--quiet", "--retries", "0"]


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789-never-written")  # the server's key (conftest)


def probe(capsys, *args: str) -> tuple[int, dict]:
    status = main(["probe", *args, "--json"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, json.loads(captured.out)


def test_a_correct_drafting_server_against_a_plain_one_is_numerical(server, capsys):
    """Side B's divergences all happen inside verify chunks; the recomputed prefixes measure that
    path (A's one-token decode against B's multi-token forward), and each reason names it."""
    plain, drafting = f"{server}/numerical+rows/content/v1", f"{server}/numerical+rows+verify/content/v1"
    status, report = probe(capsys, plain, drafting, *FAST, "--concurrency", "1")
    assert report["side_b"]["placeholders"] > 0.8 * report["side_b"]["tokens"]
    diverged = [p for p in report["prompts"] if p["divergence"] is not None]
    assert diverged and status == 0 and report["verdict"] == "numerical", report["counts"]
    for p in diverged:
        assert p["divergence_path"] in ("decode/verify", "prompt/prompt"), p
        assert "within the noise" in p["reason"] and "of side A " in p["reason"]
    pairs = {p["pair"]: p for p in report["noise"]["pairs"]}
    assert pairs["decode/verify"]["source"] == "recomputed" and pairs["decode/verify"]["measured"]
    assert pairs["decode/verify"]["estimate"] > 100 * report["noise"]["estimate"]  # the 1e-05 that misled


def test_without_the_recomputation_the_verify_path_is_unattributed(server, capsys):
    plain, drafting = f"{server}/numerical+rows/content/v1", f"{server}/numerical+rows+verify/content/v1"
    status, report = probe(capsys, plain, drafting, *FAST, "--concurrency", "1", "--calibrate", "0")
    assert status == 1 and report["verdict"] == "unattributed" and report["counts"]["suspect"] == 0
    for p in (p for p in report["prompts"] if p["divergence_path"] == "decode/verify"):
        assert p["verdict"] == "unattributed"
        assert p["reason"].startswith("the verify path's noise was not measured (side A decode vs side B verify)")
        assert "placeholders on side B" in p["reason"] and "--calibrate 4" in p["reason"]


@pytest.mark.parametrize("mode", ["numerical", "bug", "order", "mask"])
def test_drafting_alone_against_concurrent_keeps_the_bugs(server, capsys, mode):
    """One drafting server, alone against 4 in flight: bugs behind placeholders stay suspect (side
    B's recomputation is sent as copies of one prompt, where no batch-composition bug acts, so no
    bug lends itself noise); the correct server is never suspect."""
    status, report = probe(capsys, f"{server}/{mode}+rows+verify/content/v1", *FAST, "--concurrency", "4")
    assert report["side_b"]["placeholders"] > 0
    if mode == "numerical":
        assert report["verdict"] in ("identical", "numerical"), [p["reason"] for p in report["prompts"]]
    else:
        assert status == 1 and report["verdict"] == "suspect", report["counts"]
        assert report["counts"]["suspect"] >= 4
