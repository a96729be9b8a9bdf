"""The app's probe section opens saved reports only: the bundled example draws, a crafted or
oversized upload is one line, and no component takes a URL (a Space never contacts an address a
visitor chose)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from specviz.app import files, probe_tab, uploads
from specviz.errors import SpecvizError


def test_bundled_report_opens_and_draws() -> None:
    names = probe_tab.bundled_reports()
    assert "probe-example.json" in names
    report = probe_tab.load_bundled_report("probe-example.json")
    assert probe_tab.summary_markdown(report).startswith(f"**verdict: {report.verdict}**")
    with pytest.raises(SpecvizError):
        probe_tab.load_bundled_report("../README.md")  # names from the list only


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x1f\x8b not json", "not a JSON file"),
        (json.dumps({"format": "specviz-trace"}).encode(), "not a specviz probe report"),
        (json.dumps({"format": "specviz-probe", "version": 99}).encode(), "version 99"),
    ],
)
def test_bad_uploads_are_one_line_and_deleted(content: bytes, message: str) -> None:
    folder = Path(tempfile.mkdtemp(dir=files.gradio_temp_root()))  # where Gradio puts an upload
    upload = folder / "r.json"
    upload.write_bytes(content)
    uploads.UPLOADS.uploaded([upload])  # as the app's /upload and the event that queued it record
    uploads.UPLOADS.claim("visitor", [upload])
    with pytest.raises(SpecvizError) as info:
        probe_tab.load_uploaded_report(str(upload), "visitor")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not upload.exists()  # read once, then gone


def test_oversized_upload_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upload = tmp_path / "big.json"
    upload.write_bytes(b" " * 2048)
    monkeypatch.setattr(probe_tab, "MAX_REPORT_UPLOAD_BYTES", 1024)
    uploads.UPLOADS.uploaded([upload])
    uploads.UPLOADS.claim("visitor", [upload])
    with pytest.raises(SpecvizError, match="limit of a probe report"):
        probe_tab.load_uploaded_report(str(upload), "visitor")


def test_no_component_of_the_page_takes_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    import app

    config = app.build_app().get_config_file()
    labels = [str(c.get("props", {}).get("label") or "").lower() for c in config["components"]]
    assert any("bundled report" in label for label in labels)
    assert not any("url" in label or "server address" in label for label in labels)
