"""One attack at a time against a server, with the probe running and the goals checked; the
client calls the attacks share."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradio_client import Client, handle_file

from tools.attacks.server import Probe, Server
from tools.attacks.settings import GOAL_GROWTH_MB, GOAL_PROBE_S, GOAL_SECONDS, PROBE_TRACE


@dataclass
class Result:
    attack: str
    peak_growth_mb: float = 0.0
    kept_mb: float = 0.0
    seconds: float = 0.0
    probe_max_s: float = 0.0
    probe_median_s: float = 0.0
    probe_failures: int = 0
    outcome: str = ""
    notes: dict[str, Any] = field(default_factory=dict)
    # The attack's wall-time goal; None where it states per-request goals instead (`attack_sessions`).
    goal_seconds: float | None = GOAL_SECONDS

    def problems(self) -> list[str]:
        found = []
        if self.peak_growth_mb > GOAL_GROWTH_MB:
            found.append(f"memory growth {self.peak_growth_mb:.0f} MB > {GOAL_GROWTH_MB}")
        if self.goal_seconds is not None and self.seconds > self.goal_seconds:
            found.append(f"{self.seconds:.1f} s > {self.goal_seconds:g}")
        if self.outcome.startswith("no answer within"):
            found.append(self.outcome)
        if self.probe_max_s > GOAL_PROBE_S:
            found.append(f"second visitor waited {self.probe_max_s:.1f} s > {GOAL_PROBE_S}")
        if self.probe_failures:
            found.append(f"second visitor had {self.probe_failures} failure(s)")
        return found + [str(v) for k, v in self.notes.items() if k.startswith("problem")]


class Suite:
    def __init__(self, start: Callable[[], Server], timeout: float) -> None:
        self.start = start
        self.server = start()
        self.server.wait_up()
        self.probe = Probe(self.server.url)
        self.timeout = timeout
        self.results: list[Result] = []
        self.leftovers = 0

    def restart(self) -> None:
        """An attack killed the server (an old checkout): a fresh one for the next attack."""
        self.probe.stop()
        self.leftovers += self.server.leftover_files()
        self.server.stop()
        self.server = self.start()
        self.server.wait_up()
        self.probe = Probe(self.server.url)

    def run(self, name: str, attack: Callable[[Result], str], timeout: float | None = None) -> Result:
        """Run `attack` with the probe asking meanwhile; `timeout` (default the suite's) guards a hang."""
        timeout = self.timeout if timeout is None else timeout
        result = Result(name)
        if self.server.killed or not self.server.alive():
            self.server.proc.wait(timeout=60)
            self.restart()
        base = self.server.rss()
        self.server.peak = base
        self.probe.start()
        started = time.perf_counter()
        done: list[str] = []

        def body() -> None:
            try:
                done.append(attack(result))
            except Exception as exc:  # noqa: BLE001 - the app's answer is the outcome
                done.append(f"error: {str(exc)[:160]}")

        worker = threading.Thread(target=body, daemon=True)
        worker.start()
        worker.join(timeout=timeout)
        result.seconds = round(time.perf_counter() - started, 1)
        result.probe_max_s, result.probe_failures = self.probe.stop()
        result.probe_max_s = round(result.probe_max_s, 2)
        result.probe_median_s = round(statistics.median(self.probe.latencies), 2) if self.probe.latencies else 0.0
        if self.probe.failures:
            result.notes["probe_failures_first"] = self.probe.failures[:3]
        result.peak_growth_mb = round(self.server.peak - base)
        time.sleep(1.0)
        result.kept_mb = round(self.server.rss() - base) if self.server.alive() else 0
        if self.server.killed:
            result.outcome = f"killed at the {self.server.kill_mb / 1024:.0f} GB cap"
        elif not done:
            result.outcome = f"no answer within {timeout:.0f} s"
        else:
            result.outcome = done[0]
        self.results.append(result)
        print(json.dumps(result.__dict__), flush=True)
        return result


def _texts(out: Any) -> list[str]:
    values = out if isinstance(out, (list, tuple)) else [out]
    found = []
    for value in values:
        if isinstance(value, dict):
            value = value.get("value")
        if isinstance(value, str):
            found.append(value)
    return found


def app_error(out: Any) -> str | None:
    """The app's one-line error: a raised gr.Error, or (newer app) a "⚠️" status it returns."""
    return next((t for t in _texts(out) if t.startswith("⚠️")), None)


def upload(url: str, path: Path, slot: str = "a") -> str:
    client = Client(url, verbose=False)
    out = client.predict(handle_file(str(path)), 40, False, api_name=f"/load_upload_{slot}")
    error = app_error(out)
    if error:
        return f"error: {error[:200]}"
    summary = next((t for t in _texts(out) if "Run " in t), "")
    return "loaded: " + summary.splitlines()[0][:100] if summary else "loaded"


def load_heavy(url: str, path: Path, slot: str = "a") -> tuple[Client, str]:
    """A fresh API session holding `path` in a slot (a bundled trace if the app refuses the file)."""
    client = Client(url, verbose=False)
    out = client.predict(handle_file(str(path)), 40, False, api_name=f"/load_upload_{slot}")
    error = app_error(out)
    if error:
        client.predict(PROBE_TRACE, 40, False, api_name=f"/load_bundled_{slot}")
        return client, f"refused ({error[:120]})"
    return client, "accepted"


def fn_index(url: str, api_name: str) -> int:
    with urllib.request.urlopen(url + "config", timeout=30) as resp:
        config = json.load(resp)
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)


def raw_event(url: str, api_name: str, data: list[Any], session: str, timeout: float = 60) -> dict[str, Any]:
    """One event as a hand-written client sends it: any values (a file path nobody uploaded in this
    session), no upload step. The completed message: {"success": ..., "output": {"data": [...]}}."""
    import httpx

    body = {"data": data, "fn_index": fn_index(url, api_name), "session_hash": session, "trigger_id": None}
    joined = httpx.post(url + "gradio_api/queue/join", json=body, timeout=timeout)
    joined.raise_for_status()
    event_id = joined.json()["event_id"]
    params = {"session_hash": session}
    with httpx.stream("GET", url + "gradio_api/queue/data", params=params, timeout=timeout) as stream:
        for line in stream.iter_lines():
            message = json.loads(line[5:]) if line.startswith("data:") else {}
            if message.get("msg") == "process_completed" and message.get("event_id") == event_id:
                return message
    raise RuntimeError(f"{api_name}: the event stream closed before the event completed")


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False
