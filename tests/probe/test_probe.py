"""`specviz probe` end to end against tests/support/probe_server.py (the embedded target on loopback)."""

from __future__ import annotations

import json
import socket

import pytest

from specviz.cli import main
from specviz.engine.models import DEFAULT_TARGET
from specviz.probe.report_read import load_report

KEY = "sk-test-0123456789-never-written"
FAST = ["--num-prompts", "8", "--max-tokens", "12", "--concurrency", "4", "--quiet", "--retries", "0"]


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("PROBE_TEST_KEY", KEY)
    return ["--api-key-env", "PROBE_TEST_KEY"]


def probe(capsys, *args: str) -> tuple[int, dict, str]:
    status = main(["probe", *args, "--json"])
    captured = capsys.readouterr()
    return status, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def test_identical_server_with_repeats(server, capsys, key_env, tmp_path):
    out = tmp_path / "identical.json"
    status, report, _ = probe(
        capsys, f"{server}/identical/legacy/v1", *FAST, *key_env, "--repeats", "2", "--out", str(out)
    )
    assert status == 0
    assert report["verdict"] == "identical" and report["counts"]["identical"] == 8
    assert report["nondeterministic"] == 0
    text = out.read_text()
    assert KEY not in text and KEY not in json.dumps(report)
    assert load_report(out).verdict == "identical"
    # A, A again (the calibration), B twice, 6 prompts as batches of 4 copies, /v1/models
    assert report["timing"]["requests"] == 8 * 4 + 6 * 4 + 1
    assert report["timing"]["overhead_fraction"] < 0.05


def test_numerical_server(server, capsys, key_env):
    status, report, _ = probe(capsys, f"{server}/numerical/legacy/v1", *FAST, *key_env)
    assert status == 0, report
    assert report["verdict"] == "numerical"
    assert report["counts"]["numerical"] >= 1 and report["counts"]["suspect"] == 0
    assert 1e-3 < report["noise"]["estimate"] < 0.5  # bfloat16 batches against float32 singles
    diverged = [p for p in report["prompts"] if p["verdict"] == "numerical"]
    assert all(p["token_a"]["text"] != p["token_b"]["text"] and p["swing"] is not None for p in diverged)


def test_bug_server_is_suspect(server, capsys, key_env):
    status, report, _ = probe(capsys, f"{server}/bug/content/v1", *FAST, *key_env)
    assert status == 1
    assert report["verdict"] == "suspect" and report["counts"]["suspect"] >= 2


def test_chat_endpoint(server, capsys, key_env):
    status, report, _ = probe(capsys, f"{server}/identical/content/v1", *FAST, *key_env, "--endpoint", "chat")
    assert status == 0 and report["verdict"] == "identical"


def test_wrong_key_is_one_line(server, capsys, monkeypatch):
    monkeypatch.setenv("PROBE_TEST_KEY", "wrong")
    status, _, err = probe(capsys, f"{server}/identical/legacy/v1", *FAST, "--api-key-env", "PROBE_TEST_KEY")
    assert status == 2 and err.count("\n") == 1 and "HTTP 401" in err and "wrong" not in err


def test_no_logprobs_unattributed_then_replayed(server, capsys, key_env):
    url = f"{server}/numerical/none/v1"
    status, report, _ = probe(capsys, url, *FAST, *key_env)
    assert status == 1 and report["verdict"] == "unattributed", report["counts"]
    assert report["counts"]["numerical"] == 0
    status, report, _ = probe(capsys, url, *FAST, *key_env, "--replay", DEFAULT_TARGET, "--replay-dtype", "bfloat16")
    assert report["noise"]["source"] == "replay"
    assert report["counts"]["unattributed"] == 0 and report["counts"]["suspect"] == 0, report["prompts"]
    assert status == 0 and report["verdict"] in ("numerical", "identical")


def test_server_decoder_is_transformers_llama():
    """The test server's plain-torch Llama gives transformers' logits bit for bit (both dtypes,
    left-padded batch and a cached decode step) and its tokenizer transformers' IDs and texts."""
    import torch
    from probe_server import Decoder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    decoder = Decoder(DEFAULT_TARGET)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    texts = [
        "Hello world, how are you?",
        "The quick brown fox",
        "a\n b  c \u00fcn\u00efcode \u65e5\u672c <|endoftext|> x",
    ]
    prompts = []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert decoder.tokenizer(text)["input_ids"] == ids
        assert decoder.tokenizer.decode(ids) == tokenizer.decode(ids)
        assert [decoder.tokenizer.decode([i]) for i in ids] == [tokenizer.decode([i]) for i in ids]
        prompts.append(ids)
    width = max(map(len, prompts))
    ids = torch.tensor([[decoder.pad] * (width - len(p)) + p for p in prompts])  # (3, width)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    step_mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], dim=-1)
    step_pos = torch.tensor([[len(p)] for p in prompts])
    for dtype, mine in ((torch.float32, decoder.f32), (torch.bfloat16, decoder.bf16)):
        hf = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET, dtype=dtype).eval()
        with torch.inference_mode():
            out = hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            cache: list = []
            logits = mine(ids, mask, positions, cache)
            assert torch.equal(out.logits[mask.bool()], logits[mask.bool()]), dtype
            token = out.logits[:, -1].argmax(-1).view(-1, 1)
            step = hf(input_ids=token, attention_mask=step_mask, position_ids=step_pos, cache=out.cache)
            assert torch.equal(step.logits, mine(token, step_mask, step_pos, cache)), dtype


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_line(capsys):
    status, _, err = probe(capsys, f"http://127.0.0.1:{_free_port()}/v1", *FAST, "--timeout", "2")
    assert status == 2 and err.count("\n") == 1 and "unreachable" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["ftp://example/v1"], "not an http(s) URL"),
        (["http://127.0.0.1:1/v1", "--concurrency", "0"], "--concurrency must be at least 1"),
        (["http://127.0.0.1:1/v1", "--logprobs", "50"], "--logprobs must be between"),
    ],
)
def test_bad_arguments_are_one_line(capsys, args, message):
    status, _, err = probe(capsys, *args, "--quiet")
    assert status == 2 and err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "a"}\n{"prompt": 3}\n', ":2: 'prompt' must be a non-empty string"),
        ('{"prompt": "a"}\nnot json\n', ":2: not valid JSON"),
        ('{"messages": [{"role": "wizard", "content": "x"}]}\n', ":1: messages[0].role must be one of"),
        ('{"prompt": "a", "messages": []}\n', ":1: expected an object with 'prompt'"),
    ],
)
def test_bad_prompts_file_is_one_line(capsys, tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    status, _, err = probe(capsys, "http://127.0.0.1:1/v1", "--prompts", str(path), "--quiet")
    assert status == 2 and err.count("\n") == 1 and message in err
