"""The probe against a real speculative vLLM server (`python -m vllm.entrypoints.openai.api_server`
on the embedded default pair, CPU, float32): with a draft model and with n-gram, concurrency 1
against 8 is identical, acceptance per draft position is read from vLLM's
`..._per_pos_total` counters at each level and holds, copies of one prompt sent together get one
answer, and the offline replay (`python -m specviz.probe.offline vllm`, what a failed run's
command runs) decodes what the server answered.

vLLM lives in its own environment (requirements-vllm.txt). These run where it is importable (the
vLLM CI job runs tests/vllm in it), or where SPECVIZ_VLLM_PYTHON names a Python that has it (the
server and the replay are subprocesses); elsewhere they skip, by design.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specviz.cli import main
from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specviz.probe.client import Client, Endpoint, InFlightClock
from specviz.probe.prompts import load_prompts

_SPEC = importlib.util.find_spec("vllm")  # tests/vllm itself is a namespace package "vllm": no origin
VLLM_PYTHON = sys.executable if _SPEC and _SPEC.origin else os.environ.get("SPECVIZ_VLLM_PYTHON")
pytestmark = [
    pytest.mark.allowed_skip(reason="vLLM is installed by requirements-vllm.txt, in its own environment"),
    pytest.mark.skipif(not VLLM_PYTHON, reason="vLLM is not importable here and SPECVIZ_VLLM_PYTHON is not set"),
]
ENV = {  # CPU, in-process engine core, and a small KV reservation: the machine is shared
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
}
ENGINE_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512"]
ENGINE_FLAGS += ["--kv-cache-memory-bytes", str(64 * 2**20)]
METHODS = {
    "draft_model": {"method": "draft_model", "model": DEFAULT_DRAFT, "num_speculative_tokens": 3},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
}
PROMPTS, TOKENS = 8, 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def vllm_server(spec: dict, log: Path, timeout_s: float = 300, env: dict | None = None) -> Iterator[str]:
    """A speculative vLLM server on a loopback port; its /v1 URL once /health answers; stopped after."""
    port = _free_port()
    command = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", DEFAULT_TARGET]
    command += ["--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "8", *ENGINE_FLAGS]
    command += ["--speculative-config", json.dumps(spec)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ENV, **(env or {})},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(port):
            tail = log.read_text(errors="replace")[-500:]
            assert proc.poll() is None, f"vLLM server exited ({proc.returncode}): {tail}"
            assert time.monotonic() < deadline, f"vLLM server not ready after {timeout_s:.0f} s: {tail}"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture(scope="module", params=list(METHODS))
def server(request, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(method, URL): one server at a time (module scope, one per method, in turn)."""
    with vllm_server(METHODS[request.param], tmp_path_factory.mktemp("vllm") / "server.log") as url:
        yield request.param, url


def probe(capsys, *args: str) -> tuple[int, dict, str]:
    base = [*args, "--num-prompts", str(PROMPTS), "--max-tokens", str(TOKENS), "--quiet", "--retries", "0"]
    status = main(["probe", *base, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert main(["probe", *base]) == status  # the text output: the same prompts, the same verdict
    return status, report, capsys.readouterr().out


def test_concurrency_1_vs_8_is_identical_with_acceptance_per_position(server, capsys):
    method, url = server
    status, report, text = probe(capsys, url, "--concurrency", "1,8")
    assert status == 0 and report["verdict"] == "identical" and report["collapse"] is None, text
    one, eight = (level["acceptance"] for level in report["levels"])
    assert one["source"] == eight["source"] == "prometheus" and one["drafted"] > 0
    for a, b in zip(one["positions"], eight["positions"], strict=True):
        assert b["conditional_high"] >= a["conditional_low"] and a["conditional_high"] >= b["conditional_low"]
    accepted = [p["accepted"] for p in one["positions"]]
    assert len(accepted) == 3 and accepted == sorted(accepted, reverse=True)  # acceptance is a prefix
    assert abs(sum(accepted) - one["accepted"]) <= 0, (accepted, one)  # the per-position counters add up
    assert "acceptance per draft position" in text and "given 0" in text


def test_copies_sent_together_get_one_answer(server, capsys):
    _, url = server
    status = main(["probe", url, "--distinct", "8", "--num-prompts", "4", "--max-tokens", str(TOKENS), "--quiet"])
    assert status == 0, capsys.readouterr().out


def test_the_offline_replay_decodes_what_the_server_answered(server, capsys):
    """The command a failed run prints runs `specviz.probe.offline vllm` with the server's flags;
    greedy, it must give the server's answers (here without the watch: the vLLM producer of the
    watch is its own work)."""
    method, url = server
    replay = [VLLM_PYTHON, "-m", "specviz.probe.offline", "vllm", "--model", DEFAULT_TARGET]
    replay += ["--num-prompts", "4", "--max-tokens", str(TOKENS), "--max-num-seqs", "8", *ENGINE_FLAGS]
    replay += ["--speculative-config", json.dumps(METHODS[method])]
    env = {**os.environ, **ENV, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(replay, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"index"')]
    side = Client(Endpoint.parse(url), "completions", None, TOKENS, 0, None, InFlightClock(), 60.0, 0)
    side.model = side.discover_model()
    try:
        served = [side.complete(p).text for p in load_prompts(None, 4)]
    finally:
        side.close()
    assert [x["text"] for x in lines] == served


LOOPS = ["one two three", "red green blue", "the cat sat on the mat", "A B C D", "x = x + 1;", "la la la"]


def test_a_drafting_bug_at_depth_1_is_a_collapse_at_that_position(tmp_path, capsys):
    """vLLM with a bug injected at run time (tests/vllm/deep_draft_fault: in a batch, every request
    but the first gets its n-gram draft wrong from position 1 on): the answers stay identical,
    position 0 holds, position 1 given 0 collapses at concurrency 8, and the run exits 1 with the
    command that replays it offline. Prompts that repeat themselves, so n-gram drafts are often
    right and a few prompts give enough rounds at depth 1."""
    prompts = tmp_path / "loops.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join([w] * 4)}) + "\n" for w in LOOPS))
    fault = {"PYTHONPATH": str(Path(__file__).parent / "deep_draft_fault"), "SPECVIZ_DEEP_DRAFT_FAULT": "1"}
    with vllm_server(METHODS["ngram"], tmp_path / "server.log", env=fault) as url:
        args = ["probe", url, "--concurrency", "1,8", "--prompts", str(prompts), "--max-tokens", "24", "--quiet"]
        status = main([*args, "--retries", "0", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "identical" and status == 1, report["levels"]
    collapse = report["collapse"]
    assert collapse["concurrency"] == 8 and collapse["position"] == 1 and "draft position 1" in collapse["detail"]
    one, eight = (level["acceptance"]["positions"] for level in report["levels"])
    assert eight[0]["conditional_high"] >= one[0]["conditional_low"]  # position 0 held
    assert eight[1]["conditional_high"] < one[1]["conditional_low"]
    command = report["replay_command"]
    assert command["engine"] == "vllm" and "specviz.probe.offline vllm" in command["command"]
