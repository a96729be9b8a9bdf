"""What one visitor sends: hostile uploads, another session's files, repeated uploads, HTML in a
header, model paths."""

from __future__ import annotations

import random
from pathlib import Path

from gradio_client import Client, handle_file

from tools.attacks.files import (
    base_trace,
    fitting_steps,
    hostile_probe_report_file,
    html_method_file,
    many_steps_file,
    mask_runs_file,
    piece_table_file,
    probe_report_file,
    session_file,
    token_bomb_file,
    width_file,
    write_json,
)
from tools.attacks.suite import Result, Suite, _texts, app_error, raw_event, upload, wait_for


def attack_uploads(suite: Suite, folder: Path, quick: bool, match: str = "") -> None:
    """The hostile files of issue 12 and 23, each uploaded once (`match`: only those whose name has it)."""
    inflated = 64 if quick else 402
    steps = 200_000 if quick else 10**6
    # The heaviest file that passes every cap: as many steps as fit under the JSON limit.
    fitting = fitting_steps((8 if quick else 31) * 2**20)
    pieces = 600_000 if quick else 2_150_000  # issue 23: 2.15M entries is 33 MB of JSON, 5.6 MB gzip
    files = {  # made before the clock starts: the attack is the upload
        "mask_rle: 200 runs of 10^7 per row": mask_runs_file(folder),
        "query_len = 10^6": width_file(folder, "query_len", 10**6),
        "cache_len = 10^6": width_file(folder, "cache_len", 10**6),
        f"gzip inflating to {inflated} MiB of tokens": token_bomb_file(folder, inflated),
        f"{steps} steps (gzip)": many_steps_file(folder, steps),
        f"{fitting} steps" + ("" if quick else ", the most under the caps"): many_steps_file(folder, fitting),
        f"piece table of {pieces} entries": piece_table_file(folder, pieces),
    }
    for name, path in files.items():
        if match not in name:
            continue
        size = path.stat().st_size
        suite.run(f"{name} [{size // 1024} KB]", lambda r, path=path: upload(suite.server.url, path))


def attack_foreign_upload(suite: Suite, folder: Path) -> None:
    """Issue 23: a visitor who knows another visitor's upload path loads it while the owner's load
    waits in the queue (behind the owner's previous load), and loads a file the app cached (a
    download). Both must be refused as a missing file is, and nothing read away or deleted."""
    from gradio_client.utils import Status

    def steal(result: Result) -> str:
        url = suite.server.url
        victim = Client(url, verbose=False)
        heavy = victim.submit(handle_file(str(many_steps_file(folder, 3_000))), 40, False, api_name="/load_upload_a")
        wait_for(lambda: heavy.status().code in (Status.PROCESSING, Status.FINISHED))
        name = f"victim-{random.randrange(16**8):08x}.json"
        mine = victim.submit(
            handle_file(str(write_json(folder / name, base_trace()))), 40, False, api_name="/load_upload_a"
        )
        queued = (Status.IN_QUEUE, Status.PROCESSING, Status.FINISHED)
        wait_for(lambda: mine.status().code in queued and any(suite.server.temp.rglob(name)))
        path = next(suite.server.temp.rglob(name), None)
        # A file the app cached beside the uploads (as a live run's download), in the app's folder.
        download = (path.parent.parent if path else suite.server.temp) / "d0wnl0ad" / "live-eqspec.json"
        download.parent.mkdir(parents=True, exist_ok=True)
        write_json(download, base_trace())
        answers = {}
        for label, target in (("upload", path), ("download", download), ("missing", download.with_name("x.json"))):
            data = [{"path": str(target), "meta": {"_type": "gradio.FileData"}}, None, 40, False]
            message = raw_event(url, "load_upload_b", data, f"thief-{label}", timeout=suite.timeout)
            output = message.get("output") or {}
            refused = None if message.get("success") else f"refused by Gradio: {output.get('error')}"
            answers[label] = refused or app_error(output.get("data", [])) or "loaded"
        owner = app_error(mine.result(timeout=suite.timeout)) or "loaded"
        heavy.result(timeout=suite.timeout)
        result.notes.update(answers=answers, owner=owner, download_kept=download.exists())
        if answers["upload"] == "loaded" or answers["download"] == "loaded":
            result.notes["problem_read"] = f"another session's file was loaded: {answers}"
        if len(set(answers.values())) != 1:
            result.notes["problem_oracle"] = f"the answers tell files apart: {answers}"
        if owner != "loaded" or not download.exists():
            result.notes["problem_deleted"] = (
                f"the owner's file went: owner {owner[:80]}, download kept {download.exists()}"
            )
        return f"thief: {answers['upload'][:60]}; owner: {owner[:60]}"

    suite.run("another session's upload and a cached download, by path", steal)


def attack_session(suite: Suite, folder: Path, times: int) -> None:
    path = session_file(folder)

    def same_upload(result: Result) -> str:
        client = Client(suite.server.url, verbose=False)
        after = []
        for _ in range(times):
            client.predict(handle_file(str(path)), 40, False, api_name="/load_upload_a")
            after.append(round(suite.server.rss()))
        result.notes["rss_after_each_mb"] = after
        growth = after[-1] - after[0]
        result.notes["growth_after_first_mb"] = growth
        if growth > 150:
            result.notes["problem_session"] = f"RSS grew {growth} MB over {times - 1} repeated uploads"
        return f"{times} uploads"

    suite.run(f"same {path.stat().st_size // 1024} KB upload x{times}, one session", same_upload)


def attack_html(suite: Suite, folder: Path) -> None:
    def method(result: Result) -> str:
        client = Client(suite.server.url, verbose=False)
        out = client.predict(handle_file(str(html_method_file(folder))), 40, False, api_name="/load_upload_a")
        text = " ".join(_texts(out))
        if "<img" in text:
            result.notes["problem_html"] = "the summary carries a raw <img> tag"
        return "raw <img> in the summary" if "<img" in text else "escaped"

    suite.run("header.method = <img src=x>", method)


def attack_models(suite: Suite) -> None:
    def probe_paths(result: Result) -> str:
        client = Client(suite.server.url, verbose=False)  # each answer is compared, not timed
        messages = []
        for target in ("/etc", "/nonexistent/model", "gpt2"):
            args = ("eqspec", "none", 2, 2, 4, 1, "hi", target, target, 40, False)
            try:
                out = client.predict(*args, api_name="/live_run_a")
                messages.append(app_error(out) or "ran")
            except Exception as exc:  # noqa: BLE001 - the message is what we compare
                messages.append(str(exc)[:200])
        result.notes["messages"] = messages
        if len(set(messages)) != 1 or "ran" in messages:
            result.notes["problem_models"] = "model paths load or the answers differ by path"
        return "refused alike" if len(set(messages)) == 1 and "ran" not in messages else "paths probed"

    suite.run("live-run model fields: /etc, a missing path, a hub id", probe_paths)


def attack_addresses(suite: Suite) -> None:
    """Issue 34: file arguments naming an address (a public one: Gradio's guard spares only private
    and loopback ones), sent through the call API to both trace slots and the probe-report upload by
    sessions that uploaded nothing. The server must refuse them without one `connect()` (the
    server's connections are logged and refused by `connect_log/sitecustomize.py`)."""
    addresses = ["http://93.184.215.14/x.json", "https://93.184.215.14/r.json.gz", "ftp://93.184.215.14/x.json"]

    def fetch(result: Result) -> str:
        before = len(suite.server.connects())
        answers = []
        for address in addresses:
            file = {"path": address, "url": address, "orig_name": "x.json", "meta": {"_type": "gradio.FileData"}}
            for api, data in (("load_upload_a", [file, None, 40, False]), ("open_upload", [file])):
                try:
                    message = raw_event(suite.server.url, api, data, f"fetch-{random.randrange(16**8):08x}")
                    output = message.get("output") or {}
                    answers.append(str(output.get("error") or app_error(output.get("data", [])) or "loaded"))
                except Exception as exc:  # noqa: BLE001 - a refused join is an HTTP error
                    answers.append(str(getattr(getattr(exc, "response", None), "text", exc))[:160])
        connects = suite.server.connects()[before:]
        result.notes.update(connects=len(connects), first_connects=connects[:3], answers=sorted(set(answers))[:3])
        if connects:
            result.notes["problem_outbound"] = f"the server connected {len(connects)} time(s): {connects[:3]}"
        return f"{len(addresses) * 2} requests, {len(connects)} outbound connect() call(s)"

    suite.run("file arguments naming a public address (any scheme), both uploads", fetch)


def attack_ticket_flood(suite: Suite, folder: Path, paths: int) -> None:
    """Issue 34: while a visitor's upload waits in the queue (claimed, behind its own heavier load),
    another client floods `/upload` with `paths` tiny files, more than the ledger remembers free
    tickets of. The visitor's upload must still load: a claimed ticket is kept until read."""
    import httpx
    from gradio_client.utils import Status

    def flood(result: Result) -> str:
        url = suite.server.url
        victim = Client(url, verbose=False)
        heavy = victim.submit(handle_file(str(many_steps_file(folder, 3_000))), 40, False, api_name="/load_upload_a")
        wait_for(lambda: heavy.status().code in (Status.PROCESSING, Status.FINISHED))
        mine = victim.submit(handle_file(str(write_json(folder / "queued.json", base_trace()))), 40, False,
                             api_name="/load_upload_b")  # fmt: skip
        wait_for(lambda: mine.status().code in (Status.IN_QUEUE, Status.PROCESSING, Status.FINISHED))
        sent, batch = 0, 1_000
        with httpx.Client(timeout=suite.timeout) as client:
            while sent < paths:
                files = [("files", (f"f{sent + i}.json", b"{}")) for i in range(min(batch, paths - sent))]
                client.post(url + "gradio_api/upload", files=files).raise_for_status()
                sent += len(files)
        owner = app_error(mine.result(timeout=suite.timeout)) or "loaded"
        heavy.result(timeout=suite.timeout)
        result.notes.update(flood_paths=sent, owner=owner)
        if owner != "loaded":
            result.notes["problem_ticket"] = f"the queued upload was lost to the flood: {owner[:120]}"
        return f"{sent} flooded paths; the queued upload: {owner[:60]}"

    suite.run(f"{paths} uploaded paths while a visitor's upload waits in the queue", flood)


def attack_local_readers(suite: Suite, folder: Path, root: Path, quick: bool) -> None:
    """Issue 34: `specviz check` (a CI gate reading other jobs' artifacts) on each hostile local
    file: refused in one line that names no folder, within 2 GB (each in a process of its own; one
    run of the suite for all: the server is not involved)."""
    from tools.attacks.local_files import LOCAL_GOAL_PEAK_MB, check_peak, local_files

    made = {name: make(folder) for name, make in local_files(quick).items()}

    def check(result: Result) -> str:
        result.goal_seconds = 30.0 * len(made)  # the suite's 30 s, per file
        outcomes = []
        for i, (name, path) in enumerate(made.items()):
            status, line, peak = check_peak(root, path, suite.timeout)
            result.notes[f"file{i}"] = {
                "file": f"{name} [{path.stat().st_size // 1024} KB]", "exit": status,
                "peak_rss_mb": round(peak), "message": line[:200],
            }  # fmt: skip
            if peak > LOCAL_GOAL_PEAK_MB:
                result.notes[f"problem_rss{i}"] = f"{name}: peak RSS {peak:.0f} MB > {LOCAL_GOAL_PEAK_MB}"
            if status != 2 or not line.startswith("specviz: error:") or str(path.parent) in line:
                result.notes[f"problem_refusal{i}"] = f"{name}: exit {status}, not a one-line refusal: {line[:160]}"
            outcomes.append(f"{peak:.0f} MB exit {status}")
        return "; ".join(outcomes)

    suite.run(f"local check of {len(made)} hostile files: {', '.join(made)}", check, timeout=suite.timeout * len(made))


# What report text must never become in the page: a tag of its own in the HTML parts (escaped text
# like `&lt;img` or a literal `](http` is inert there), and no Markdown image or link in the status
# line, the one Markdown part (it is empty on success, and errors never quote a report).
_HTML_LOADS = ("<img", "<a ", "<script", "<iframe", "<svg", "url(", "javascript:alert(1)>")
_MARKDOWN_LOADS = ("](", "<img", "<a ")


def attack_probe_reports(suite: Suite, folder: Path, quick: bool) -> None:
    """Issue 34: the largest probe report a public upload accepts (the prompt cap), every text field
    hostile, costs at most GOAL_UPLOAD_CPU_S of server CPU and puts no image, link or tag of its own
    into the answer; one over the cap is refused in one line before the report is built."""
    from specviz.app.probe_tab import PUBLIC_MAX_PROMPTS
    from tools.attacks.server import _cpu_s
    from tools.attacks.settings import GOAL_UPLOAD_CPU_S

    largest = hostile_probe_report_file(folder, PUBLIC_MAX_PROMPTS if not quick else 2_000)
    over = probe_report_file(folder, PUBLIC_MAX_PROMPTS + 1_000)  # under the 8 MiB upload cap

    def open_report(path: Path) -> tuple[list[str], list[str], float]:
        """The HTML parts and the Markdown status line of the answer, and the server CPU it cost."""
        client = Client(suite.server.url, verbose=False)
        cpu = _cpu_s(suite.server.proc.pid)
        out = client.predict(handle_file(str(path)), api_name="/open_upload")
        # The API leaves the session state out: the status line first, then the summary, plots, answers.
        status = _texts(out[:1]) if isinstance(out, (list, tuple)) else []
        html = _texts(out[1:]) if isinstance(out, (list, tuple)) else _texts(out)
        return html, status, _cpu_s(suite.server.proc.pid) - cpu

    def largest_report(result: Result) -> str:
        html, status, cpu = open_report(largest)
        page = " ".join(html)
        loads = sorted({mark for mark in _HTML_LOADS if mark in page})
        loads += sorted({mark for mark in _MARKDOWN_LOADS if mark in " ".join(status)})
        result.notes.update(cpu_s=round(cpu, 2), answer_kb=len(page) // 1024)
        if loads:
            result.notes["problem_report_text"] = f"report text reached the page as {loads}"
        if cpu > GOAL_UPLOAD_CPU_S:
            result.notes["problem_upload_cpu"] = f"the report cost {cpu:.2f} s of server CPU > {GOAL_UPLOAD_CPU_S}"
        error = next((t for t in status if t.startswith("⚠️")), None)
        if error:
            result.notes["problem_refused"] = f"the largest accepted report was refused: {error[:120]}"
        return f"refused: {error[:120]}" if error else f"opened, {cpu:.2f} s CPU, {len(page) // 1024} KB, loads {loads}"

    def over_cap(result: Result) -> str:
        _, status, cpu = open_report(over)
        error = next((t for t in status if t.startswith("⚠️") and "prompts" in t), None)
        result.notes["cpu_s"] = round(cpu, 2)
        if error is None:
            result.notes["problem_over_cap"] = "a report over the public prompt cap was opened"
        return f"refused in one line ({cpu:.2f} s CPU)" if error else "opened"

    suite.run(f"probe report of {largest.stat().st_size // 1024} KB, every text field hostile", largest_report)
    suite.run(f"probe report of {PUBLIC_MAX_PROMPTS + 1_000} prompts [{over.stat().st_size // 1024} KB]", over_cap)
