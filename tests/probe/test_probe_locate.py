"""From suspect to located (specviz.probe.locate, specviz.probe.offline): a failed probe run
against an engine specviz can run comes with one command that replays its prompts offline under
the watch; the replay itself runs, and its answers are the target's batch-1 greedy ones (the
oracle: specviz.engine.reference, no engine code)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specviz.cli import main
from specviz.engine.models import DEFAULT_TARGET
from specviz.engine.reference import greedy_reference
from specviz.probe import locate
from specviz.probe.prompts import load_prompts

ARGS = ["--num-prompts", "8", "--max-tokens", "12", "--quiet", "--retries", "0", "--concurrency", "4"]


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789-never-written")  # the server's key (conftest)


def test_a_suspect_run_comes_with_the_replay_command(server, capsys, tmp_path):
    out = tmp_path / "bug.json"
    flags = "--dtype float32 --cb-num-blocks 32"
    args = [f"{server}/bug/legacy/v1", *ARGS, "--engine", "transformers", "--server-args", flags]
    status = main(["probe", *args, "--out", str(out)])
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert status == 1 and report["verdict"] == "suspect" and report["version"] == 4
    replay = report["replay_command"]
    suspect = [p["index"] for p in report["prompts"] if p["verdict"] in ("suspect", "unattributed")]
    assert replay["engine"] == "transformers" and replay["prompts"] == suspect and replay["max_num_seqs"] == 4
    words = shlex.split(replay["command"])
    assert words[:5] == ["specviz", "watch", "--out", str(tmp_path / "bug.replay.trace.json"), "--"]
    assert words[5:9] == ["python", "-m", "specviz.probe.offline", "transformers"]
    assert words[words.index("--max-tokens") + 1] == "12" and words[words.index("--num-prompts") + 1] == "8"
    assert words[words.index("--focus") + 1] == ",".join(map(str, suspect)) and words[-4:] == shlex.split(flags)
    assert "own scheduler" in replay["note"] and replay["command"] in text and "locate it" in text
    assert f"python app.py --trace {words[3]} --probe {out}" in report["next_steps"][-1]


def test_no_command_where_nothing_failed_or_the_engine_is_unknown(server, capsys):
    assert main(["probe", f"{server}/identical/legacy/v1", *ARGS, "--engine", "transformers", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["replay_command"] is None
    assert main(["probe", f"{server}/bug/legacy/v1", *ARGS, "--json"]) == 1  # auto: the server does not say
    assert json.loads(capsys.readouterr().out)["replay_command"] is None


class Card:
    """A client whose /v1/models answered `card`."""

    def __init__(self, card: dict, model: str | None = "served-name") -> None:
        self.card, self.model = card, model

    def model_card(self) -> dict:
        return self.card


def test_vllm_is_recognised_from_its_model_card():
    card = {"id": "served-name", "owned_by": "vllm", "root": "/models/target"}
    assert locate.identify(Card(card), "auto") == ("vllm", "/models/target")  # type: ignore[arg-type]
    assert locate.identify(Card({"id": "x", "owned_by": "someone"}), "auto") == (None, None)  # type: ignore[arg-type]
    assert locate.identify(Card({"id": "x"}), "transformers") == ("transformers", "served-name")  # type: ignore[arg-type]
    assert locate.identify(Card({"root": 3}, None), "vllm") == (None, None)  # type: ignore[arg-type]


def test_the_transformers_replay_runs_under_the_watch_and_decodes_the_target_greedily(tmp_path):
    """The replay command's own form: `specviz watch --out T -- python -m specviz.probe.offline
    transformers ...` (continuous batching, 2 requests a forward, 3 prompts, so one waits)."""
    trace = tmp_path / "replay.trace.json"
    replay = [sys.executable, "-m", "specviz.probe.offline", "transformers", "--model", DEFAULT_TARGET]
    replay += ["--num-prompts", "3", "--max-tokens", "8", "--max-num-seqs", "2", "--focus", "1"]
    replay += ["--dtype", "float32", "--cb-num-blocks", "32", "--cb-block-size", "16"]
    command = [sys.executable, "-m", "specviz", "watch", "--out", str(trace), "--", *replay]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"index"')]
    assert [x["index"] for x in lines] == [0, 1, 2] and [x["focus"] for x in lines] == [False, True, False]
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    target = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET, dtype=torch.float32).eval()
    for prompt, line in zip(load_prompts(None, 3), lines):
        ids = tokenizer(prompt.as_text())["input_ids"]
        expected, _ = greedy_reference(target, ids, 8, frozenset([tokenizer.eos_token_id]))
        assert line["token_ids"] == expected
    assert trace.exists() and trace.stat().st_size > 0
