"""Issue 23: stopping the app leaves no file. `python app.py --public` with a live run, an upload and
a download in flight gets SIGTERM: its folders (Gradio's cache with every upload and download, the
live-run traces) are gone once it has exited, and a crashed earlier process's folders go when the
next one starts. Every wait is for a condition (the app's "Running on" line, a job's status).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gradio_client import Client, handle_file
from gradio_client.utils import Status

from specviz.app.files import LIVE_PREFIX, OWNER_MARKER
from tools.attack_suite import free_port, many_steps_file

ROOT = Path(__file__).resolve().parents[2]
LIVE_ARGS = ("eqspec", "none", 2, 2, 8, 2, "", "", "", 40, False)  # what a public page sends


def _start(temp: Path) -> tuple[subprocess.Popen, str]:
    """The app in public mode, its temp folders under `temp`; returns once it says it serves."""
    env = dict(
        os.environ, GRADIO_TEMP_DIR=str(temp / "gradio"), TMPDIR=str(temp / "tmp"), SPACE_ID="specviz/test",
        GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(free_port()), GRADIO_ANALYTICS_ENABLED="False",
        OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for line in proc.stdout:  # the readiness handshake: Gradio's "Running on local URL: ..."
        if "Running on local URL:" in line:
            return proc, line.split("URL:", 1)[1].strip().rstrip("/") + "/"
    raise AssertionError(f"the app exited ({proc.wait()}) before serving")


def _wait(condition, timeout_s: float = 120) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def _files(temp: Path) -> list[str]:
    return sorted(str(p.relative_to(temp)) for p in temp.rglob("*") if not p.is_dir())


def test_sigterm_under_load_leaves_nothing_and_start_up_removes_a_crash(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    crashed = tmp_path / "tmp" / f"{LIVE_PREFIX}crashed"  # what a SIGKILLed app left: its marker, a trace
    crashed.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (crashed / OWNER_MARKER).write_text(f"{dead.stdout.strip()} 1")
    (crashed / "live-eqspec.json.gz").write_bytes(b"x")
    heavy = many_steps_file(tmp_path, 10_000)  # outside the app's folders: the visitor's copy
    proc, url = _start(tmp_path)
    try:
        assert not crashed.exists()  # removed at start-up, before the app served
        done = Client(url, verbose=False, download_files=False).predict(*LIVE_ARGS, api_name="/live_run_a")
        assert any("live-" in str(v) for v in done)  # a download the app cached
        assert any("live-" in name for name in _files(tmp_path / "gradio"))
        long_run = ("eqspec", "none", 8, 4, 64, 16, "", "", "", 40, False)  # the public bounds: long
        running = Client(url, verbose=False, download_files=False).submit(*long_run, api_name="/live_run_b")
        assert _wait(lambda: running.status().code == Status.PROGRESS)  # decoding, saving soon
        loading = Client(url, verbose=False).submit(handle_file(str(heavy)), 40, False, api_name="/load_upload_a")
        assert _wait(lambda: loading.status().code == Status.PROCESSING)  # uploaded, being read
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait(lambda: not _files(tmp_path / "gradio") and not _files(tmp_path / "tmp"), 30), _files(
        tmp_path / "gradio"
    ) + _files(tmp_path / "tmp")
    assert heavy.exists()


def test_the_reaper_removes_the_folders_of_a_killed_app(tmp_path: Path) -> None:
    """SIGKILL runs no handler: the reaper started with the app removes its folders once it is gone
    (and so does a write that raced with the SIGTERM handler's removal)."""
    folder = tmp_path / "specviz-live-x"
    folder.mkdir()
    (folder / "trace.json.gz").write_bytes(b"x")
    code = (
        "import sys; from specviz.app.files import start_reaper; start_reaper(sys.argv[1:]);"
        "print('ready', flush=True); sys.stdin.read()"
    )
    app_like = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert app_like.stdout.readline().strip() == "ready"  # the reaper listens
    assert folder.exists()  # nothing removed while the app lives
    app_like.kill()
    app_like.wait(timeout=30)
    assert _wait(lambda: not folder.exists(), 30)
