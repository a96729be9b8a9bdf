"""Issue 43's attacks (round four): trace strings as Markdown, hostile links, the widest step and
trees the public budget admits, a tree field one entry long, round two's piece table again, absurd
times in a Perfetto export, and the install folder in any answer."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from gradio_client import Client, handle_file

from tools.attacks.files import base_trace, big_trees_file, piece_table_file, wide_step_file, write_json
from tools.attacks.server import _cpu_s
from tools.attacks.settings import GOAL_UPLOAD_CPU_S
from tools.attacks.suite import Result, Suite, _texts, app_error

GOAL_DRAW_CPU_S = 1.0  # a first render, a key press (a grid step), a report
GOAL_ANSWER_BYTES = 2 << 20
GOAL_REPORT_BYTES = 5 << 20
HOST = "93.184.215.14"
MARKUP = f"![x](http://{HOST}/pixel.png) [c](javascript:alert(1)) <img src=http://{HOST}/i.png onerror=alert(1)>"


def _answer_bytes(out: Any) -> int:
    return len(json.dumps(out, default=str))


# Trace markup that reached an answer as itself: a tag (html_text writes `&lt;img`) anywhere, and in
# a Markdown part a link target not escaped (md_text writes `\](`). An HTML part (gr.HTML: it starts
# with a tag) renders no Markdown, so a literal `](http` there is text.
_TAG = re.compile(r"<img|<script|<iframe|<a href=.?(?:http|javascript)")
_MARKDOWN_LINK = re.compile(r"(?<!\\)\]\((?:http|javascript)")


def _active(texts: list[str]) -> list[str]:
    found = []
    for text in texts:
        patterns = (_TAG,) if text.lstrip().startswith("<") else (_TAG, _MARKDOWN_LINK)
        found += [text[max(m.start() - 60, 0) : m.end() + 60] for p in patterns for m in p.finditer(text)]
    return found


def markup_file(folder: Path) -> Path:
    data = base_trace()
    data["header"]["schema_version"] = 2
    data["header"]["options"] = {"watch_unreadable": {"step": 1, "why": MARKUP}, "note": MARKUP}
    data["header"]["target"]["name"] = data["header"]["engine"] = MARKUP
    for seq in data["sequences"]:
        seq["prompt"] = seq["output_text"] = MARKUP
    return write_json(folder / "markup.json", data)


def long_attends_file(folder: Path) -> Path:
    """The bundled tree run with one row's node_attends one entry longer than its tree."""
    from specviz.app.loading import TRACES

    data = json.loads(gzip.decompress((TRACES / "default-eqspec-tree2.json.gz").read_bytes()))
    row = next(r for s in data["steps"] for r in s["rows"] if r.get("node_attends"))
    row["node_attends"] = [*row["node_attends"], [0]]
    return write_json(folder / "long-attends.json", data)


def attack_drawing(suite: Suite, folder: Path, root: Path, quick: bool) -> None:
    """Each upload from a fresh session: the server's CPU for the upload, a grid step and the report,
    the bytes of each answer, markup and the install folder in any answer."""
    files = {  # made before the clock starts
        "trace strings as Markdown": markup_file(folder),
        "node_attends one longer than the tree": long_attends_file(folder),
        "1,024 rows x 64 query slots, 590-char token texts": wide_step_file(folder),
        "3 steps x 255 rows of 257-node trees": big_trees_file(folder),
    }
    install = str(root)

    def draw(result: Result) -> str:
        result.goal_seconds = 30.0 * len(files)
        pid = suite.server.proc.pid
        outcomes = []
        for i, (name, path) in enumerate(files.items()):
            try:
                outcomes.append(_draw_one(suite, pid, i, name, path, install, result))
            except Exception as exc:  # noqa: BLE001 - an old checkout's error: this file's problem, go on
                result.notes[f"problem_error{i}"] = f"{name}: {str(exc)[:160]}"
                outcomes.append(f"{name}: error")
        return "; ".join(outcomes)

    suite.run("drawing bounds: " + ", ".join(files), draw, timeout=suite.timeout * len(files))


def _draw_one(suite: Suite, pid: int, i: int, name: str, path: Path, install: str, result: Result) -> str:
    """One file from a fresh session: its upload, a grid step and the report, checked."""
    client = Client(suite.server.url, verbose=False)
    cpu = _cpu_s(pid)
    out = client.predict(handle_file(str(path)), 40, False, api_name="/load_upload_a")
    upload_cpu = _cpu_s(pid) - cpu
    answers = [out]
    error = app_error(out)
    cpu = _cpu_s(pid)
    answers.append(client.predict("A", 0, -1, 40, api_name="/grid"))  # row "none": in every step's choices
    grid_cpu = _cpu_s(pid) - cpu
    cpu = _cpu_s(pid)
    report = client.predict("A", api_name="/report")
    report_cpu = _cpu_s(pid) - cpu
    report_path = report.get("value") if isinstance(report, dict) else report
    report_bytes = os.path.getsize(report_path) if report_path and os.path.isfile(str(report_path)) else 0
    sizes = [_answer_bytes(a) for a in answers]
    note = {
        "file": f"{name} [{path.stat().st_size // 1024} KB]", "error": (error or "")[:160],
        "upload_cpu_s": round(upload_cpu, 2), "grid_cpu_s": round(grid_cpu, 2),
        "report_cpu_s": round(report_cpu, 2), "answer_bytes": sizes, "report_bytes": report_bytes,
    }  # fmt: skip
    result.notes[f"file{i}"] = note
    found = _active([t for a in answers for t in _texts(a)])
    problems = {
        "upload_cpu": upload_cpu > GOAL_UPLOAD_CPU_S,
        "grid_cpu": grid_cpu > GOAL_DRAW_CPU_S,
        "report_cpu": report_cpu > GOAL_DRAW_CPU_S,
        "answer_bytes": max(sizes) > GOAL_ANSWER_BYTES,
        "report_bytes": report_bytes > GOAL_REPORT_BYTES,
        "markup": bool(found),
        "install_path": install in json.dumps(answers, default=str),
        "error": bool(error) and "unexpected" in error,
    }
    for what, bad in problems.items():
        if bad:
            result.notes[f"problem_{what}{i}"] = f"{name}: {what} ({note}; {found[:2]})"
    return f"{name}: {upload_cpu:.1f}/{grid_cpu:.1f}/{report_cpu:.1f} s, {max(sizes) >> 10} KB"


def attack_piece_table_again(suite: Suite, folder: Path) -> None:
    """Round two's 2.15M-entry piece table (5.6 MB gzip): refused within 3 s of server CPU, keeping little."""
    path = piece_table_file(folder, 2_150_000)

    def upload(result: Result) -> str:
        pid = suite.server.proc.pid
        cpu, started = _cpu_s(pid), time.perf_counter()
        client = Client(suite.server.url, verbose=False)
        out = client.predict(handle_file(str(path)), 40, False, api_name="/load_upload_a")
        spent = _cpu_s(pid) - cpu
        result.notes.update(server_cpu_s=round(spent, 2), wall_s=round(time.perf_counter() - started, 2))
        if spent > GOAL_UPLOAD_CPU_S:
            result.notes["problem_cpu"] = f"{spent:.2f} s of server CPU > {GOAL_UPLOAD_CPU_S}"
        return (app_error(out) or "loaded")[:160]

    suite.run(f"round two's piece table again [{path.stat().st_size // 1024} KB]", upload)


HOSTILE_LINKS = ("step=--1", "step=%C2%B2", "row=--3", "step=1&step=2", "step=&row=", "step=" + "9" * 400)


def attack_links(suite: Suite) -> None:
    """Page loads whose link carries hostile values (the page-load event as a browser sends it, the
    query string on its request): each must open the runs, with a status line, never an error."""
    url = suite.server.url
    index = next(d["id"] for d in _dependencies(url) if _is_page_load(d))

    def links(result: Result) -> str:
        failed = []
        for query in HOSTILE_LINKS:
            session = uuid.uuid4().hex[:12]
            body = {"data": [40, False], "fn_index": index, "session_hash": session, "trigger_id": None}
            joined = httpx.post(f"{url}gradio_api/queue/join?{query}", json=body, timeout=suite.timeout)
            message = _completed(url, session, joined.json()["event_id"], suite.timeout)
            texts = _texts((message.get("output") or {}).get("data", []))
            if not message.get("success") or not any("Run A" in t for t in texts):
                failed.append(f"{query[:30]}: {str(message.get('output'))[:120]}")
        if failed:
            result.notes["problem_links"] = failed
        return f"{len(HOSTILE_LINKS) - len(failed)} of {len(HOSTILE_LINKS)} links opened the page"

    suite.run("hostile links", links)


def _is_page_load(dependency: dict[str, Any]) -> bool:
    """The page-load event that reads the link (the other one only runs the page's script)."""
    targets = dependency.get("targets") or []
    return any(t[-1] == "load" for t in targets) and bool(dependency.get("backend_fn"))


def _dependencies(url: str) -> list[dict[str, Any]]:
    return httpx.get(url + "config", timeout=30).json()["dependencies"]


def _completed(url: str, session: str, event_id: str, timeout: float) -> dict[str, Any]:
    params = {"session_hash": session}
    with httpx.stream("GET", url + "gradio_api/queue/data", params=params, timeout=timeout) as stream:
        for line in stream.iter_lines():
            message = json.loads(line[5:]) if line.startswith("data:") else {}
            if message.get("msg") == "process_completed" and message.get("event_id") == event_id:
                return message
    return {"success": False, "output": "the event stream closed"}


def attack_perfetto(suite: Suite, folder: Path, root: Path) -> None:
    """`specviz export --perfetto` (the checkout's) of a trace whose step times are 1.5e308 ms: the
    file must parse as strict JSON (JSON.parse and Perfetto refuse Infinity)."""
    data = copy.deepcopy(base_trace())
    for step in data["steps"]:
        step["draft_ms"] = step["verify_ms"] = step["total_ms"] = 1.5e308
    path = write_json(folder / "huge-times.json", data)
    out = folder / "huge-times.perfetto.json"

    def export(result: Result) -> str:
        command = [sys.executable, "-m", "specviz", "export", "--perfetto", str(path), "-o", str(out)]
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=suite.timeout, check=False)
        try:
            json.loads(out.read_text(), parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
            return f"exit {done.returncode}: strict JSON"
        except (OSError, ValueError) as exc:
            result.notes["problem_perfetto"] = f"not strict JSON: {str(exc)[:120]}"
            return f"exit {done.returncode}: {str(exc)[:80]}"

    suite.run("perfetto export of 1.5e308 ms steps", export)
