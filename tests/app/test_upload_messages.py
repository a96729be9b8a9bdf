"""What the app says of an upload that is no JSON trace (the button takes any file, so its line,
not Gradio's "Error" toast, answers): the file named by what it is, and what to upload instead."""

from __future__ import annotations

import pytest

from specviz.app.messages import plain_trace_message
from specviz.trace.io import TraceError, parse_trace_bytes


def said(raw: bytes, name: str) -> str:
    with pytest.raises(TraceError) as refused:
        parse_trace_bytes(raw, name)
    return plain_trace_message(str(refused.value))


@pytest.mark.parametrize(
    "name,raw,kind",
    [
        ("screenshot.png", b"\x89PNG\r\n\x1a\n" + bytes(32), "a PNG image"),
        ("photo.jpg", b"\xff\xd8\xff\xe0" + bytes(32), "a JPEG image"),
        ("paper.pdf", b"%PDF-1.7\n" + bytes(32), "a PDF document"),
        ("traces.zip", b"PK\x03\x04" + bytes(32), "a zip archive"),
    ],
)
def test_a_file_of_another_kind_is_named_by_its_kind(name: str, raw: bytes, kind: str) -> None:
    message = said(raw, name)
    assert message.startswith(f"{name} is {kind}") and "not a specviz trace" in message, message
    assert ".json.gz" in message
    assert "UTF-8" not in message and "\n" not in message


def test_a_parquet_trace_is_pointed_to_where_it_opens() -> None:
    message = said(b"PAR1\x15\x04\x15\xff\xfe" + bytes(32), "run.parquet")
    assert "python app.py --trace run.parquet" in message and "specviz convert" in message, message
