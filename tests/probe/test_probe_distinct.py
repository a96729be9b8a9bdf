"""`specviz probe URL --distinct N`: copies of one prompt sent together must get one answer. The
oracle is how tests/support/probe_server.py was built: `identical` and `numerical` decode every
copy of a prompt alike (a batch of copies has rows of one length and one content), `+slot` makes
the request in a batch's second slot re-read its previous position from its third token on."""

from __future__ import annotations

import json

import pytest

from specviz.cli import main
from specviz.probe.distinct import compare_copies
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer, Token

ARGS = ["--num-prompts", "3", "--max-tokens", "10", "--quiet", "--retries", "0"]


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789-never-written")  # the server's key (conftest)


def distinct(capsys, url: str, copies: int = 4, *extra: str) -> tuple[int, dict, str]:
    status = main(["probe", url, "--distinct", str(copies), *ARGS, *extra, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert main(["probe", url, "--distinct", str(copies), *ARGS, *extra]) == status
    return status, report, capsys.readouterr().out


def test_a_contaminated_slot_splits_the_copies_at_its_token(server, capsys):
    status, report, text = distinct(capsys, f"{server}/identical+slot/content/v1")
    assert status == 1 and report["verdict"] == "distinct"
    for p in report["prompts"]:
        majority, other = p["groups"]
        assert len(majority["copies"]) == 3 and len(other["copies"]) == 1 and majority["split"] is None
        assert other["split"] == 3 and other["token"] != other["majority_token"]
        assert set(majority["copies"]) | set(other["copies"]) == {0, 1, 2, 3}
    assert "DISTINCT" in text and "split at token 3" in text


@pytest.mark.parametrize("mode", ["identical", "numerical+spec+ph"])
def test_a_correct_server_gives_one_answer_placeholders_included(server, capsys, mode):
    status, report, text = distinct(capsys, f"{server}/{mode}/content/v1")
    assert status == 0 and report["verdict"] == "identical", text
    assert all(len(p["groups"]) == 1 and len(p["groups"][0]["copies"]) == 4 for p in report["prompts"])
    if "ph" in mode:  # drafted tokens' placeholders are tokens here, counted, not a difference
        assert report["placeholders"] > 0 and "carry no logprob" in text


def test_groups_without_tokens_split_by_character_and_two_urls_are_refused(capsys):
    answers = [Answer("abcd", None), Answer("abXd", None), Answer("abcd", None), Answer("abcdef", None)]
    result = compare_copies(0, Prompt(text="p"), answers)
    assert result.unit == "char" and result.distinct == 3
    majority, *others = result.groups
    assert majority.copies == (0, 2) and [(g.copies, g.split) for g in others] == [((1,), 2), ((3,), 4)]
    assert others[0].token == "X" and others[0].majority_token == "c" and others[1].token == "e"
    status = main(["probe", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", "--distinct", "2", *ARGS])
    assert status == 2 and "one URL" in capsys.readouterr().err


def test_the_majority_margin_is_shown_where_real_and_unknown_on_a_placeholder():
    real = Token(" of", 7, -0.1, ((" of", -0.1), (" the", -0.4)))
    placeholder = Token(" of", 7, None, None, placeholder=True)
    other = Token(" the", 8, -0.4, ((" the", -0.4), (" of", -0.5)))
    head = (Token("a", 1, -0.01, (("a", -0.01), ("b", -5.0))),)
    for majority_token, margin in ((real, 0.3), (placeholder, None)):
        answers = [Answer("a of", (*head, majority_token))] * 2 + [Answer("a the", (*head, other))]
        group = compare_copies(0, Prompt(text="p"), answers).groups[1]
        assert group.split == 1
        assert (group.margin is None) if margin is None else group.margin == pytest.approx(margin)
