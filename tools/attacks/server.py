"""The server under attack (`app.py` of a checkout, public mode) and the second visitor who times it."""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from gradio_client import Client

from tools.attacks.settings import PROBE_TRACE

CONNECT_LOG_DIR = Path(__file__).resolve().parent / "connect_log"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_s(pid: int) -> float:
    """The server's CPU seconds so far (user + system)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class Server:
    def __init__(self, root: Path, kill_mb: float, public: bool, run_memory_mb: float | None = None) -> None:
        self.root = root
        self.left_after_stop: list[str] = []
        self.kill_mb = kill_mb
        self.temp = Path(tempfile.mkdtemp(prefix="specviz-attack-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = dict(
            os.environ,
            GRADIO_SERVER_NAME="127.0.0.1",
            GRADIO_SERVER_PORT=str(self.port),
            GRADIO_ANALYTICS_ENABLED="False",
            GRADIO_TEMP_DIR=str(self.temp / "gradio"),
            TMPDIR=str(self.temp),
            OMP_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",  # a hub id must not make the server wait on the network here
        )
        # Every connection the server opens to another address is logged and refused (`connect_log`).
        handle, log = tempfile.mkstemp(prefix="specviz-attack-connects-", suffix=".log")  # not in the app's temp
        os.close(handle)
        self.connect_log = Path(log)
        env["SPECVIZ_CONNECT_LOG"] = str(self.connect_log)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CONNECT_LOG_DIR), os.environ.get("PYTHONPATH", "")]))
        if public:
            env["SPACE_ID"] = "specviz/attack-suite"
        if run_memory_mb:
            env["SPECVIZ_RUN_MEMORY_MB"] = str(run_memory_mb)
        self.proc = subprocess.Popen(
            [sys.executable, "app.py"], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.peak = 0.0
        self.killed = False
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            now = rss_mb(self.proc.pid)
            self.peak = max(self.peak, now)
            if now > self.kill_mb and not self.killed:
                self.killed = True
                self.proc.kill()
            time.sleep(0.05)

    def connects(self) -> list[str]:
        """The connections to other addresses the server tried so far (each refused)."""
        try:
            return self.connect_log.read_text().splitlines()
        except OSError:
            return []

    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def wait_up(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("app did not come up")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, as a Space is stopped at every restart; then note what the app left behind."""
        self._stop.set()
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.left_after_stop = sorted(str(p.relative_to(self.temp)) for p in self.temp.rglob("*") if p.is_file())
        self.connect_log.unlink(missing_ok=True)
        shutil.rmtree(self.temp, ignore_errors=True)

    def leftover_files(self) -> int:
        return sum(1 for p in self.temp.rglob("*") if p.is_file())


class Probe:
    """The second visitor: asks for a grid step again and again, timing every answer.

    It runs in its own process, as a real visitor runs on another machine: in the attacker's
    process its requests would wait for the attacker's own client threads (65 queued jobs hold
    the GIL), which measures the attacking client, not the server.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._stop: Any = None
        self._results: Any = None
        self._answered: Any = self._context.Value("l", 0)  # requests answered so far, for `answered`

    @property
    def answered(self) -> int:
        """The probe's answered requests so far: an attack that measures the server's CPU takes
        the probe's own share out (`attack_sessions`)."""
        return int(self._answered.value)

    def start(self) -> None:
        self.latencies, self.failures = [], []
        self._stop, ready, self._results = self._context.Event(), self._context.Event(), self._context.Queue()
        self._process = self._context.Process(
            target=_probe_loop, args=(self.url, self._stop, ready, self._results, self._answered), daemon=True
        )
        self._process.start()
        if not ready.wait(timeout=120):  # it loaded its trace: from here on every answer is timed
            self.failures.append("the probe could not load its trace within 120 s")

    def stop(self) -> tuple[float, int]:
        if self._process is not None:
            self._stop.set()
            try:
                latencies, failures = self._results.get(timeout=60)
                self.latencies, self.failures = self.latencies + latencies, self.failures + failures
            except queue.Empty:
                self.failures.append("the probe did not report back within 60 s")
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
            self._process = None
        return (max(self.latencies) if self.latencies else float("inf")), len(self.failures)


def _probe_loop(url: str, stop: Any, ready: Any, results: Any, answered: Any) -> None:
    """The probe process: load a bundled trace once, then time grid requests until told to stop."""
    client = Client(url, verbose=False)
    latencies: list[float] = []
    failures: list[str] = []
    try:
        client.predict(PROBE_TRACE, 40, False, api_name="/load_bundled_b")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        failures.append(f"load: {type(exc).__name__}: {str(exc)[:120]}")
    ready.set()
    step = 0
    while not stop.is_set():
        started = time.perf_counter()
        try:
            client.predict("B", step % 3, -1, 40, api_name="/grid")
            latencies.append(time.perf_counter() - started)
            with answered.get_lock():
                answered.value += 1
        except Exception as exc:  # noqa: BLE001 - every failure is counted
            failures.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            time.sleep(0.2)
        step += 1
        time.sleep(0.1)
    results.put((latencies, failures))
