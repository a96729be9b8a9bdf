"""Issue 23: an upload is readable only by the session that made it. Through the app's real wiring:
a launched app, gradio_client for the uploader, and a hand-written client (any path, no upload) for
the other visitor, who gets the answer a missing file gets while the upload stays in place.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from gradio_client import Client, handle_file

import app
from specviz.app import files, uploads
from specviz.trace.io import save_trace
from specviz.trace.synthetic import synthetic_trace
from tools.attack_suite import raw_event


@pytest.fixture(scope="module")
def url() -> Any:
    demo = app.build_app()
    _, address, _ = app.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    try:
        yield address
    finally:
        demo.close()


def _status(message: dict) -> str:
    assert message["success"], message
    values = message["output"]["data"]
    return next((v.get("value") for v in values if isinstance(v, dict) and "⚠️" in str(v.get("value"))), "")


def _file(path: str) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


def _cached(name: str) -> Path:
    return next(files.gradio_temp_root().rglob(name))


def test_another_sessions_upload_is_refused_and_left_in_place(url: str, tmp_path: Path, monkeypatch) -> None:
    name = f"mine-{uuid.uuid4().hex[:8]}.json.gz"
    trace = save_trace(synthetic_trace(4, 2, 2, 6), tmp_path / name)
    first = Client(url, verbose=False)
    entered, release = threading.Event(), threading.Event()
    original = uploads.read_upload

    def held(path: str | None, session: str | None, *args: Any) -> bytes:
        if session == first.session_hash:  # the first visitor's load waits, its file still there
            entered.set()
            assert release.wait(120)
        return original(path, session, *args)

    monkeypatch.setattr(uploads, "read_upload", held)
    job = first.submit(handle_file(str(trace)), 40, False, api_name="/load_upload_a")
    assert entered.wait(120)
    path = _cached(name)
    # A download the app cached in the same folder: no session uploaded it.
    download = path.parent.parent / "d0wnl0ad" / "live-eqspec.json.gz"
    download.parent.mkdir()
    download.write_bytes(trace.read_bytes())
    second = uuid.uuid4().hex

    def load_b(target: Path) -> str:
        return _status(raw_event(url, "load_upload_b", [_file(str(target)), None, 40, False], second))

    missing = load_b(path.parent / f"x{path.name}")
    for target in (path, download):
        status = load_b(target)
        assert status == missing  # the answer a path that never was gets: one line, no folder
        assert uploads.UPLOAD_GONE in status and str(target.parent) not in status
        assert target.read_bytes() == trace.read_bytes()  # nothing read away, nothing deleted
    release.set()
    out = job.result(timeout=120)
    assert not any("⚠️" in str(v) for v in out) and any("Run A" in str(v) for v in out)
    assert not path.exists()  # the owner read it once: then it is gone
    assert download.exists()


def test_tickets_of_one_path_and_their_release(tmp_path: Path) -> None:
    ledger = uploads.UploadLedger()
    path = tmp_path / "x" / "t.json"
    ledger.uploaded([path, path])  # the same bytes and name uploaded twice: one path, two tickets
    ledger.claim("a", [path])
    assert ledger.owns("a", path) and not ledger.owns("b", path)
    ledger.claim("b", [path])
    ledger.claim("c", [path])  # no ticket left for a third session
    assert ledger.owns("b", path) and not ledger.owns("c", path)
    assert ledger.release("a", path) is False  # b has not read it yet: the file stays
    assert not ledger.owns("a", path)
    assert ledger.release("b", path) is True
    ledger.claim(None, [path])
    assert not ledger.owns(None, path)


def test_a_claimed_ticket_outlives_any_flood_of_newer_uploads(tmp_path: Path) -> None:
    """Issue 34: 20,000 newer upload paths made the ledger forget a queued visitor's claimed ticket."""
    ledger = uploads.UploadLedger(max_paths=1_000)
    mine = tmp_path / "mine" / "t.json"
    ledger.uploaded([mine])
    ledger.claim("victim", [mine])
    flood = [tmp_path / f"f{i}" / "x.json" for i in range(30_000)]
    for start in range(0, len(flood), 100):  # the flooder's uploads, and its own claims of each
        ledger.uploaded(flood[start : start + 100])
        ledger.claim("flooder", flood[start : start + 100])
    assert ledger.owns("victim", mine)
    assert len(ledger._free) <= 1_000 and len(ledger._sessions["flooder"]) <= uploads.MAX_CLAIMS_PER_SESSION
    unclaimed = tmp_path / "late" / "t.json"
    ledger.uploaded([unclaimed])
    ledger.uploaded(flood[:1_500])  # free tickets are what a flood pushes out, oldest first
    ledger.claim("late", [unclaimed])
    assert not ledger.owns("late", unclaimed)
    assert ledger.session_ended("victim") == [os.path.realpath(mine)]  # the tab closed: its file may go
    assert not ledger.owns("victim", mine)


def test_claims_past_the_total_cap_are_not_taken_from_others(tmp_path: Path) -> None:
    ledger = uploads.UploadLedger(max_claimed=3)
    paths = [tmp_path / f"p{i}" / "t.json" for i in range(5)]
    ledger.uploaded(paths)
    for i, path in enumerate(paths):
        ledger.claim(f"s{i}", [path])
    assert [ledger.owns(f"s{i}", p) for i, p in enumerate(paths)] == [True, True, True, False, False]
    assert ledger.release("s0", paths[0]) is True
    ledger.uploaded([paths[4]])
    ledger.claim("s4", [paths[4]])
    assert ledger.owns("s4", paths[4])
