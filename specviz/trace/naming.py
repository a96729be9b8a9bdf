"""Names and timestamps shared by every layer: one spelling of a run's label, one clock format."""

from __future__ import annotations

import datetime as _dt


def model_label(name: str | None) -> str | None:
    """A model as human output names it: a local path by its folder's name (`/home/me/models/qwen`
    -> `qwen`), a hub id (`org/model`) as it is. JSON output keeps the name whole."""
    if not name:
        return name
    text = str(name).replace("\\", "/")
    local = text.startswith(("/", "~", "./", "../")) or (len(text) > 2 and text[1] == ":") or text.count("/") > 1
    return text.rstrip("/").rsplit("/", 1)[-1] if local else text


def run_title(method: str, fault: str | None) -> str:
    """How a run is named to a person: `eqspec` or `eqspec + fault stale-kv`."""
    return method + (f" + fault {fault}" if fault else "")


def run_slug(method: str, fault: str | None) -> str:
    """How a run is named in a file name: `eqspec` or `eqspec-stale-kv`."""
    return method + (f"-{fault}" if fault else "")


def now_iso() -> str:
    """UTC wall-clock time, to the second, as ISO 8601 (trace headers, benchmark reports)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
