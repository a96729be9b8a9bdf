"""The probe report's JSON Schema, from its dataclasses: docs/probe.schema.json is this, written
by `python -m specviz.probe.report_schema` (a test keeps the two equal)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from specviz.probe.report import FORMAT, MAX_TEXT, READS, VERDICTS, ProbeReport
from specviz.probe.report_read import fields_of


def json_schema() -> dict[str, Any]:
    """The report's JSON Schema, from the dataclasses: a field with a default (a version-2
    addition) is optional, so version-1 reports validate too."""
    defs: dict[str, Any] = {}

    def of(hint: Any) -> dict[str, Any]:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            (inner,) = [a for a in args if a is not type(None)]
            return {"anyOf": [of(inner), {"type": "null"}]}
        if dataclasses.is_dataclass(hint):
            name = hint.__name__
            if name not in defs:
                defs[name] = {}
                defs[name] = obj(hint)
            return {"$ref": f"#/$defs/{name}"}
        if origin is tuple:
            return {"type": "array", "items": of(args[0])}
        if origin is dict:
            return {"type": "object", "additionalProperties": of(args[1]), "maxProperties": 64}
        simple = {bool: "boolean", int: "integer", float: "number"}
        if hint in simple:
            return {"type": simple[hint]}
        return {"type": "string", "maxLength": MAX_TEXT}

    def obj(cls: Any) -> dict[str, Any]:
        fields = fields_of(cls)
        return {
            "type": "object",
            "required": [name for name, _, optional in fields if not optional],
            "properties": {name: of(hint) for name, hint, _ in fields},
        }

    schema = obj(ProbeReport)
    props = schema["properties"]
    props["format"] = {"const": FORMAT}
    props["version"] = {"enum": list(READS)}
    props["verdict"] = {"enum": list(VERDICTS)}
    props["mode"] = {"enum": ["batch", "ab"]}
    props["endpoint"] = {"enum": ["completions", "chat"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://specviz/docs/probe.schema.json",
        "title": "specviz probe report",
        "description": "Written by `specviz probe --out`; see docs/probe.md. Readers ignore unknown fields.",
        **schema,
        "$defs": defs,
    }


if __name__ == "__main__":  # regenerates docs/probe.schema.json
    out = Path(__file__).resolve().parents[2] / "docs" / "probe.schema.json"
    out.write_text(json.dumps(json_schema(), indent=2) + "\n", encoding="utf-8")
