"""Issue 34: in public mode nothing a visitor sends makes the server connect anywhere. A file
argument naming an address (`http://<public address>/x.json`, any scheme) is refused before Gradio
would fetch it, through the app's real wiring: a launched public-mode app, hand-written events (the
call API), and a guard on `socket.connect` that records (and refuses) every connection to an
address other than loopback. With the refusal taken out, the same attack does connect: the guard
is what would catch a regression.
"""

from __future__ import annotations

import inspect
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from specviz.app import uploads
from tools.attack_suite import raw_event

PUBLIC_ADDRESS = "93.184.215.14"  # a public address (no private or loopback guard spares it)
ADDRESSES = [f"http://{PUBLIC_ADDRESS}/x.json", f"https://{PUBLIC_ADDRESS}/r.json", "ftp://example.org/x.json"]


class ConnectGuard:
    """Every `connect()` of this process to an address other than loopback: recorded, refused."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

        def outside(address: Any) -> bool:
            host = address[0] if isinstance(address, tuple) else str(address)
            return host not in ("127.0.0.1", "::1", "localhost") and not str(address).startswith("/")

        def guarded(sock: socket.socket, address: Any) -> Any:
            if outside(address):
                self.seen.append(address)
                raise ConnectionRefusedError(f"test guard: no connection to {address}")
            return connect(sock, address)

        def guarded_ex(sock: socket.socket, address: Any) -> int:
            if outside(address):
                self.seen.append(address)
                return 111
            return connect_ex(sock, address)

        monkeypatch.setattr(socket.socket, "connect", guarded)
        monkeypatch.setattr(socket.socket, "connect_ex", guarded_ex)


class FetchSpy:
    """Gradio's own fetch of a URL argument (its SSRF-protected download and get): recorded, refused.
    The oracle that does not depend on the network: with an HTTP proxy in the environment Gradio's
    client connects to the proxy, not to the address, and CI machines have one."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from gradio import processing_utils

        async def refused(url: str, *args: Any, **kwargs: Any) -> Any:
            self.seen.append(str(url))
            raise ConnectionRefusedError(f"test spy: no fetch of {url}")

        for name in ("async_ssrf_protected_get", "async_ssrf_protected_download"):
            monkeypatch.setattr(processing_utils, name, refused)


def _launch(monkeypatch: pytest.MonkeyPatch, refuse: bool) -> Iterator[str]:
    from gradio import processing_utils
    from gradio.blocks import Block

    import app

    monkeypatch.setenv("SPACE_ID", "specviz/no-outbound-test")
    # The refusal patches Gradio process-wide and for good, so an app built earlier in this worker
    # (any test) has already patched it: each test starts from Gradio's own functions, restored after.
    for name in ("async_ssrf_protected_get", "async_ssrf_protected_download", "ssrf_protected_download"):
        monkeypatch.setattr(processing_utils, name, inspect.unwrap(getattr(processing_utils, name)))
    monkeypatch.setattr(processing_utils, "save_url_to_cache", inspect.unwrap(processing_utils.save_url_to_cache))
    for name in ("async_move_resource_to_block_cache", "move_resource_to_block_cache"):
        monkeypatch.setattr(Block, name, inspect.unwrap(getattr(Block, name)))
    if not refuse:  # the app as it was: Gradio fetches the address itself
        monkeypatch.setattr(uploads, "refuse_remote_files", lambda demo: None)
        monkeypatch.setattr(uploads, "is_address", lambda path: False)
    demo = app.build_app()
    _, url, _ = app.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    try:
        yield url
    finally:
        demo.close()


def _attack(url: str) -> list[str]:
    """Each address, as a trace (both slots) and as a probe report, by a session that uploaded nothing."""
    answers = []
    for address in ADDRESSES:
        file = {"path": address, "meta": {"_type": "gradio.FileData"}}
        for api, data in (
            ("load_upload_a", [file, None, 40, False]),
            ("load_upload_b", [{**file, "url": address}, None, 40, False]),  # as gradio_client sends a URL
            ("open_upload", [{**file, "orig_name": "r.json"}]),
        ):
            try:
                message = raw_event(url, api, data, uuid.uuid4().hex, timeout=60)
                answers.append(str(message.get("output", {}).get("error") or message.get("output")))
            except Exception as exc:  # noqa: BLE001 - a refused join answers with an HTTP error
                answers.append(str(getattr(getattr(exc, "response", None), "text", exc)))
    return answers


def test_addresses_in_file_arguments_are_refused_before_any_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    guard, spy = ConnectGuard(), FetchSpy()
    launched = _launch(monkeypatch, refuse=True)
    url = next(launched)
    try:
        guard.install(monkeypatch)
        spy.install(monkeypatch)
        answers = _attack(url)
    finally:
        next(launched, None)
    assert guard.seen == [] and spy.seen == []
    assert all(uploads.URL_REFUSED in answer for answer in answers), answers
    assert not any(PUBLIC_ADDRESS in answer for answer in answers)  # one line, nothing echoed


def test_without_the_refusal_gradio_connects_to_the_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guards' oracle: the app without `refuse_remote_files` lets Gradio go and fetch the address
    (issue 34 saw three `connect()` calls a request). The spy refuses the fetch itself, so the test
    neither needs nor uses the network."""
    guard, spy = ConnectGuard(), FetchSpy()
    launched = _launch(monkeypatch, refuse=False)
    url = next(launched)
    try:
        guard.install(monkeypatch)
        spy.install(monkeypatch)
        _attack(url)
    finally:
        next(launched, None)
    assert any(PUBLIC_ADDRESS in address for address in spy.seen), spy.seen


def test_every_cache_step_refuses_an_address_before_fetching(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route-independent layer: any component's cache step (queued or not) refuses an address;
    in public mode Gradio's fetch itself refuses too."""
    import asyncio

    import gradio as gr
    from gradio import processing_utils
    from gradio.exceptions import Error

    for name in ("async_ssrf_protected_get", "async_ssrf_protected_download", "ssrf_protected_download"):
        monkeypatch.setattr(processing_utils, name, getattr(processing_utils, name))
    monkeypatch.setattr(processing_utils, "save_url_to_cache", processing_utils.save_url_to_cache)
    guard = ConnectGuard()
    guard.install(monkeypatch)
    with gr.Blocks() as demo:
        upload = gr.File()
    uploads.refuse_remote_files(demo, public=True)
    for address in ADDRESSES:
        with pytest.raises(Error, match="never fetched"):
            asyncio.run(upload.async_move_resource_to_block_cache(address))
        with pytest.raises(Error, match="never fetched"):
            upload.move_resource_to_block_cache(address)
    with pytest.raises(Error, match="never fetched"):
        asyncio.run(processing_utils.async_ssrf_protected_get(ADDRESSES[0]))
    assert guard.seen == []
    assert uploads.is_address("file:///etc/passwd") and uploads.is_address("//host/x")
    assert not uploads.is_address("/tmp/gradio/0a1b/trace.json.gz")
