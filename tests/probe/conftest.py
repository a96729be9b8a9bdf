"""The probe tests' server: tests/support/probe_server.py, started once for the whole session
(every probe test file shares it), ready when it prints READY <port>."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specviz.engine.models import DEFAULT_TARGET
from specviz.probe.replay import Replayer

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "support" / "probe_server.py"
KEY = "sk-test-0123456789-never-written"


@pytest.fixture(scope="session")
def server():
    """The test server's base URL; started once, ready when it prints READY <port>.

    While it starts (a process of its own, torch without transformers: a few seconds), this
    process imports transformers and loads the replay model once, which the replay test needs
    anyway: the two overlap instead of adding up (the test builds its own Replayer, fast then).
    """
    # The server imports specviz from this checkout: its folder leads the child's import path.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PROBE_SERVER_KEY=KEY, OMP_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.Popen(
        [sys.executable, str(SERVER)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    try:
        Replayer(DEFAULT_TARGET, "bfloat16", "completions")  # warm-up: imports and file caches
    finally:
        reader.join(timeout=120)
    if not line or not line[0].startswith("READY "):
        proc.kill()
        pytest.fail("probe test server did not start")
    try:
        yield f"http://127.0.0.1:{int(line[0].split()[1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
