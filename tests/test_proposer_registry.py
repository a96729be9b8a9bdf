"""One proposer registry (`specviz/proposers.py`) is what the engine, `record`, `check` and the app
read: a proposer added as one file (`tests/support/echo_proposer.py`) plus one registry entry
records, checks clean and is offered by the app, and what it cannot do is refused by capability.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from tiny import make_pair

from specviz import proposers
from specviz.app import live
from specviz.app.run_slots import build_live_controls, proposer_choices
from specviz.cli import main
from specviz.engine.run import RunConfig, run
from specviz.errors import SpecvizError
from specviz.proposers import REGISTRY, ProposerKind, keeps_cache, proposer_kind
from specviz.trace.io import load_trace

ECHO = ProposerKind(
    "echo",
    "the pending token, k times",
    "echo_proposer:EchoProposer",
    keeps_cache=False,
    needs_draft_model=False,
    drafts_trees=False,
    scores=False,
)


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> ProposerKind:
    """The echo proposer's registry entry, for one test (monkeypatch removes it after)."""
    monkeypatch.setitem(REGISTRY, ECHO.name, ECHO)
    return ECHO


def test_an_unregistered_proposer_is_refused_everywhere(tiny_model_dirs: tuple[str, str], tmp_path: Any) -> None:
    target, draft = tiny_model_dirs
    with pytest.raises(SystemExit) as exit_:  # argparse: not among --proposer's choices
        main(["record", "--proposer", "echo", "--target", target, "--out", str(tmp_path / "x.json")])
    assert exit_.value.code == 2
    with pytest.raises(SpecvizError, match="unknown proposer 'echo'; choose from draft-model, head, ngram"):
        RunConfig(proposer="echo").validate()
    assert "echo" not in [name for _, name in proposer_choices()]


def test_a_registered_proposer_records_and_checks_clean_through_the_cli(
    echo: ProposerKind, tiny_model_dirs: tuple[str, str], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = tiny_model_dirs
    out = tmp_path / "echo.json.gz"
    args = ["--target", target, "--draft", draft, "--batch-size", "3", "--draft-k", "3", "--max-new-tokens", "8"]
    assert main(["record", "--proposer", "echo", *args, "--num-prompts", "5", "--out", str(out)]) == 0
    assert ", echo" in capsys.readouterr().out  # the summary names a proposer other than the default
    trace = load_trace(out)
    assert trace.header.proposer == "echo" and trace.header.draft is None  # no draft model was loaded
    assert all(s.output_ids == s.reference_ids for s in trace.sequences)  # batch-1 greedy of the target
    assert main(["check", str(out)]) == 0
    assert "CLEAN" in capsys.readouterr().out
    drafts = [row.draft_tokens for step in trace.steps for row in step.rows]
    assert drafts and all(len(set(d)) == 1 for d in drafts)  # it really drafted: its pending token, k times


def test_a_registered_proposer_is_offered_and_run_by_the_app(
    echo: ProposerKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gr.Blocks():
        _, (picker, *_), _, _ = build_live_controls("A")
    assert (echo.label, "echo") in picker.choices
    loads: list[bool] = []
    pair = make_pair("llama")
    monkeypatch.setattr(live, "load_model_pair", lambda target, draft, with_draft: loads.append(with_draft) or pair)
    request = live.LiveRequest(
        method="exspec", fault="none", batch_size=3, draft_k=3, max_new_tokens=8, num_prompts=4,
        prompts_text="hello world\na\nthe quick brown fox\nxyz", target="tiny", draft="tiny", proposer="echo",
    )  # fmt: skip
    loaded = live.live_run(request, lambda *a, **k: None)
    assert loads == [False]  # needs no draft model, so none is loaded
    assert loaded.trace.header.proposer == "echo" and loaded.report.verdict == "clean"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"tree_branches": 2}, "--proposer echo drafts chains only; use --tree 0"),
        (
            {"temperature": 0.7, "sampling": "rejection"},
            "--sampling rejection needs the proposer's probabilities; echo has none",
        ),
    ],
)
def test_what_a_proposer_cannot_do_is_refused_by_its_capabilities(
    echo: ProposerKind, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(SpecvizError, match=f"^{says}"):
        RunConfig(proposer="echo", **options).validate()


def test_checks_read_capabilities_not_names(echo: ProposerKind) -> None:
    """The draft cache's checks apply to a proposer that keeps a cache, whatever its name; a trace
    naming a proposer this specviz does not know (another engine's) is taken to keep none."""
    assert keeps_cache("draft-model") and not keeps_cache("echo") and not keeps_cache("eagle3")
    assert proposer_kind("head").drafts_trees and not proposer_kind("ngram").scores
    assert set(proposers.proposer_names()) == {"draft-model", "head", "ngram", "echo"}


def test_engine_builds_the_registered_class() -> None:
    pair = make_pair("llama")
    trace = run(pair, ["hello", "xy"], RunConfig(batch_size=2, draft_k=2, max_new_tokens=4, proposer="ngram"))
    assert trace.header.proposer == "ngram" and trace.header.draft is None


def test_the_docs_name_every_registered_proposer() -> None:
    """The README's `--proposer` choices and the trace schema's examples are the registry's names."""
    root = Path(__file__).resolve().parents[1]
    choices = re.search(r"--proposer \{([^}]*)\}", (root / "README.md").read_text(encoding="utf-8")).group(1)
    assert tuple(choices.split(",")) == proposers.proposer_names()
    schema = json.loads((root / "docs" / "trace.schema.json").read_text(encoding="utf-8"))
    assert tuple(schema["$defs"]["Header"]["properties"]["proposer"]["examples"]) == proposers.proposer_names()
