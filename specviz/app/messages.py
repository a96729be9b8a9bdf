"""Trace-loading messages in plain words: what a stranger who uploaded a file needs to read.

`specviz.trace` words its `TraceError`s for people who know the format ("format: expected
'specviz-trace', got None"); the app translates the common ones here (the loader's wording stays
as it is for the CLI and the logs). A message this module does not know passes through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

FORMAT_DOC = "docs/trace-format.md"


def _split(message: str) -> tuple[str, str]:
    """("name", "detail") of "name: detail" when the head names a file, else ("", message)."""
    head, sep, rest = message.partition(": ")
    if sep and re.search(r"\.(json|gz|parquet|jsonl)$", head, re.IGNORECASE):
        return head, rest
    return "", message


def _not_text(name: str, match: re.Match[str]) -> str:
    if name.lower().endswith(".parquet"):  # no file_types filter on the button: said here instead
        return (
            f"{name}: the upload reads JSON traces (.json, .json.gz); open a Parquet one locally "
            f"(python app.py --trace {name}) or convert it (specviz convert {name} trace.json.gz)"
        )
    if name.lower().endswith(".gz"):
        return f"{name} is not a gzip file: a .json.gz upload must be gzip-compressed JSON"
    return f"{name} is not a text file: a trace is JSON text (or gzip-compressed JSON)"


def _format(name: str, match: re.Match[str]) -> str:
    got = match.group(1)
    if got == "None":
        return f'{name} is JSON but not a specviz trace: it has no "format": "specviz-trace" field (see {FORMAT_DOC})'
    return f"{name} is JSON but not a specviz trace: its format is {got}, not 'specviz-trace' (see {FORMAT_DOC})"


RULES: list[tuple[re.Pattern[str], Callable[[str, re.Match[str]], str]]] = [
    (  # specviz.trace.file_kinds: a picture or an archive picked by mistake; an upload takes JSON only
        re.compile(r"^(?:(.+): )?(an? [^,:]+(?: \([^)]*\))?), not a specviz trace"),
        lambda name, m: (
            f"{m.group(1) or name} is {m.group(2)}, not a specviz trace: upload the .json or "
            ".json.gz file `specviz record` writes (a .parquet trace opens locally: python app.py --trace FILE)"
        ),
    ),
    (re.compile(r"^not UTF-8 text at byte \d+$"), _not_text),
    (re.compile(r"^format: expected 'specviz-trace', got (.*)$"), _format),
    (
        re.compile(r"^not valid JSON \((.*) at line (\d+) column (\d+)\)$"),
        lambda name, m: f"{name} is not valid JSON: {m.group(1).lower()} at line {m.group(2)}, column {m.group(3)}",
    ),
    (
        re.compile(r"^top level: expected a JSON object, got (\w+)$"),
        lambda name, m: f"{name} holds a JSON {m.group(1)}; a trace is one JSON object (see {FORMAT_DOC})",
    ),
    (
        re.compile(r"^corrupt or truncated gzip"),
        lambda name, m: f"{name} is a damaged gzip file (corrupt or cut short): download or copy it again",
    ),
    (
        re.compile(r"^gzip inflates past (\d+) bytes"),
        lambda name, m: f"{name} decompresses to more than {int(m.group(1)) // 2**20} MiB: too big to open here",
    ),
    (
        re.compile(r"^\d+ bytes of JSON, over the (\d+) byte limit$"),
        lambda name, m: f"{name} is more than {int(m.group(1)) // 2**20} MiB of JSON: too big to open here",
    ),
    (
        re.compile(r"^header\.schema_version: missing or not an integer$"),
        lambda name, m: f"{name} has no header.schema_version (a whole number): its header is missing or damaged",
    ),
    (
        re.compile(r"^header\.schema_version: trace is version (\d+), this specviz reads up to (\d+)"),
        lambda name, m: f"{name} is a version {m.group(1)} trace, newer than this app reads (up to {m.group(2)})",
    ),
    (
        re.compile(r"^JSON nested too deeply$"),
        lambda name, m: f"{name} is JSON nested too deeply to be a trace",
    ),
]


def plain_trace_message(message: str) -> str:
    """A `TraceError` message as a plain sentence naming the file; unknown messages pass through."""
    name, detail = _split(message)
    for pattern, say in RULES:
        match = pattern.search(detail)
        if match:
            return say(name or "the file", match)
    if name:  # a field-level problem: keep the field (it is how the file is fixed), say what it is
        return f"{name} is not a valid trace: {detail}"
    return message
