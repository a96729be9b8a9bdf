"""Load test of the app on loopback: `python tools/load_test.py --clients 20 --seconds 60`.

Starts `app.py` on 127.0.0.1 (a free port), then drives it with N concurrent gradio_client
sessions that load bundled traces and render views (ragged grid at random steps, run
inspection), plus a few small live runs through the queue. Reports requests, failures,
p50/p95 latency and the server's peak RSS (sampled from /proc) as one JSON object; exits 1 if
any request failed. Traffic stays on this machine; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specviz.trace.io import load_trace

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MiB."""
    total = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError("app did not come up")


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: dict[str, list[float]] = {}
        self.failures: list[str] = []

    def timed(self, kind: str, call, *args, **kwargs) -> None:
        started = time.perf_counter()
        try:
            call(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
            with self.lock:
                self.failures.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
            return
        with self.lock:
            self.latencies.setdefault(kind, []).append(time.perf_counter() - started)


def client_loop(url: str, traces: list[str], min_steps: int, until: float, stats: Stats, seed: int) -> None:
    from gradio_client import Client

    rng = random.Random(seed)
    client = Client(url, verbose=False)
    while time.time() < until:
        name = rng.choice(traces)
        label = rng.choice(["a", "b"])
        stats.timed("load_trace", client.predict, name, 48, False, api_name=f"/load_bundled_{label}")
        for _ in range(3):
            if time.time() >= until:
                break
            step = rng.randrange(0, min_steps)  # the slider refuses steps a run does not have
            stats.timed("render_grid", client.predict, label.upper(), step, -1, 48, api_name="/grid")


def live_loop(url: str, runs: int, until: float, stats: Stats) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    for i in range(runs):
        if time.time() >= until:
            break
        args = (
            "eqspec",
            "none" if i % 2 == 0 else "stale-kv",
            4,
            4,
            16,
            4,
            "",
            DEFAULT_TARGET,
            DEFAULT_DRAFT,
            48,
            False,
        )
        stats.timed("live_run", client.predict, *args, api_name="/live_run_b")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--live-runs", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = dict(
        os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False"
    )
    server = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    peak = [0.0]
    try:
        wait_until_up(url, server)
        traces = sorted(p.name for p in (ROOT / "traces").glob("*.json.gz"))
        min_steps = min(len(load_trace(ROOT / "traces" / name).steps) for name in traces)
        stats = Stats()
        until = time.time() + args.seconds
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mb(server.pid))
                time.sleep(0.5)

        threads = [threading.Thread(target=sample, daemon=True)]
        threads += [
            threading.Thread(target=client_loop, args=(url, traces, min_steps, until, stats, i))
            for i in range(args.clients)
        ]
        threads += [threading.Thread(target=live_loop, args=(url, args.live_runs, until, stats))]
        started = time.time()
        for t in threads:
            t.start()
        for t in threads[1:]:
            t.join(timeout=args.seconds + 600)
        done.set()
        elapsed = time.time() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    every = [x for values in stats.latencies.values() for x in values]
    report = {
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "requests": len(every) + len(stats.failures),
        "failures": len(stats.failures),
        "p50_s": round(statistics.median(every), 3) if every else None,
        "p95_s": round(percentile(every, 0.95), 3),
        "per_kind": {
            k: {"n": len(v), "p50_s": round(statistics.median(v), 3), "p95_s": round(percentile(v, 0.95), 3)}
            for k, v in stats.latencies.items()
        },
        "peak_rss_mb": round(peak[0], 1),
        "first_failures": stats.failures[:5],
    }
    print(json.dumps(report, indent=2))
    return 1 if stats.failures else 0


if __name__ == "__main__":
    sys.exit(main())
