"""No answer names the folder the app is installed in (issue 43, attack 8: every fault one-liner
linked `/gradio_api/file=<absolute install folder>/docs/faults.md`). The docs pages the page links
to are served under `/specviz/docs/`, only those, as text that loads nothing."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from gradio_client import Client

import app
from specviz.app import run_slots
from specviz.app.loading import ROOT, bundled_traces
from specviz.views.faults import FAULTS_DOC_URL, fault_markdown

INSTALL = str(ROOT)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A public-mode page (its hidden model fields are part of the page's config too)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_slots, "PUBLIC", True)
        demo = app.build_app()
    _, address, _ = app.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    try:
        yield address.rstrip("/")
    finally:
        demo.close()


def get(url: str) -> tuple[int, bytes, Any]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def test_a_fault_line_links_a_page_by_its_name() -> None:
    line = fault_markdown("stale-kv")
    assert FAULTS_DOC_URL in line and INSTALL not in line and "gradio_api/file=" not in line


def test_the_docs_pages_are_served_and_nothing_else(url: str) -> None:
    status, body, headers = get(url + FAULTS_DOC_URL)
    assert status == 200 and b"# Faults" in body and INSTALL.encode() not in body
    assert headers["X-Content-Type-Options"] == "nosniff" and "default-src 'none'" in headers["Content-Security-Policy"]
    assert get(url + "/specviz/docs/probe.md")[0] == 200
    for other in ("app.md", "..%2Fapp.py", "../app.py", "%2Fetc%2Fpasswd", "space.md"):
        assert get(url + "/specviz/docs/" + other)[0] == 404
    # The old static route no longer serves the checkout's docs by their absolute path.
    assert get(url + f"/gradio_api/file={ROOT / 'docs' / 'faults.md'}")[0] != 200


def test_no_answer_names_the_install_folder(url: str) -> None:
    client = Client(url + "/", verbose=False)
    faulty = next(name for name in bundled_traces() if "stale-kv" in name)
    answers = [client.predict(faulty, 40, False, api_name="/load_bundled_a")]
    answers.append(client.predict("A", 0, -1, 40, api_name="/grid"))
    text = json.dumps(answers, default=str)
    assert FAULTS_DOC_URL in text  # the fault's line and its link are in the answer
    assert INSTALL not in text
    status, page, _ = get(url + "/config")
    assert status == 200 and INSTALL.encode() not in page
