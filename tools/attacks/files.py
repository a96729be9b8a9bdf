"""The attack files: traces as a hostile visitor would upload them, made before the clock starts."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Schema version 1 fields: the files must load in older checkouts too (to measure "before").
V1_HEADER = {
    "schema_version", "method", "fault", "target", "draft", "draft_k", "batch_size", "max_new_tokens",
    "eos_token_ids", "pad_token_id", "seed", "created_at", "library_versions", "engine", "options",
    "complete", "finished_at", "decode_seconds", "fault_events",
}  # fmt: skip
V1_ROW = {
    "row", "seq_id", "committed_before", "left_pad", "left_pad_after", "pending_token", "draft_tokens",
    "target_tokens", "accepted", "bonus", "emitted", "write_seq", "position_ids", "mask_rle", "kv_len",
    "kv_len_expected", "draft_kv_len", "draft_kv_len_expected", "finished", "finish_reason",
}  # fmt: skip


def base_trace(prompts: int = 4, batch: int = 2, k: int = 4, new: int = 8) -> dict[str, Any]:
    """A small correct trace as JSON values, in the version-1 subset every checkout reads."""
    from specviz.trace.io import trace_to_dict
    from specviz.trace.synthetic import synthetic_trace

    data = trace_to_dict(synthetic_trace(prompts, batch, k, new))
    data["header"] = {key: v for key, v in data["header"].items() if key in V1_HEADER}
    data["header"]["schema_version"] = 1
    for step in data["steps"]:
        step["rows"] = [{key: v for key, v in row.items() if key in V1_ROW} for row in step["rows"]]
    return data


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, separators=(",", ":")))
    return path


def mask_runs_file(folder: Path) -> Path:
    data = base_trace()
    for step in data["steps"]:
        for row in step["rows"]:
            row["mask_rle"] = [[1, 10**7]] * 200
    return write_json(folder / "mask-runs.json", data)


def width_file(folder: Path, field_name: str, value: int) -> Path:
    data = base_trace()
    for step in data["steps"]:
        step[field_name] = value
    return write_json(folder / f"{field_name}-{value}.json", data)


def _stream_gzip(path: Path, parts: Iterator[str]) -> Path:
    with gzip.open(path, "wt", compresslevel=9) as out:
        for part in parts:
            out.write(part)
    return path


def token_bomb_file(folder: Path, inflated_mib: int) -> Path:
    """A small gzip inflating to `inflated_mib` MiB of output and reference tokens."""
    data = base_trace()
    per_list = inflated_mib * 2**20 // (2 * 2 * len(data["sequences"]))  # "7," is 2 bytes
    marker = "__TOKENS__"
    for seq in data["sequences"]:
        seq["output_ids"] = seq["reference_ids"] = marker
        seq["reference_margins"] = None
    head, *rest = json.dumps(data, separators=(",", ":")).split(f'"{marker}"')

    rng = random.Random(0)

    def parts() -> Iterator[str]:
        # One varying token in 500: gzip shrinks it ~140x, as the 2.8 MB for 402 MiB.
        yield head
        for tail in rest:
            yield "["
            for _ in range(per_list // (501 * 64)):
                yield "".join("7," * 500 + f"{rng.randrange(10**6)}," for _ in range(64))
            yield "7]" + tail

    return _stream_gzip(folder / f"tokens-{inflated_mib}mib.json.gz", parts())


def many_steps_file(folder: Path, steps: int) -> Path:
    data = base_trace()
    step = json.dumps(data["steps"][0], separators=(",", ":"))
    number = f'"step":{data["steps"][0]["step"]},'
    assert number in step
    head = json.dumps({**data, "steps": "__STEPS__"}, separators=(",", ":")).split('"__STEPS__"')

    def parts() -> Iterator[str]:
        yield head[0] + "["
        for i in range(steps):
            yield ("," if i else "") + step.replace(number, f'"step":{i},')
        yield "]" + head[1]

    return _stream_gzip(folder / f"steps-{steps}.json.gz", parts())


def heaviest_steps() -> int:
    """Steps of `many_steps_file` at the public budget's step and row caps (the checkout under
    test's budget, `--root`)."""
    from specviz.trace.budget import PUBLIC_BUDGET

    rows = len(base_trace()["steps"][0]["rows"])
    return min(PUBLIC_BUDGET.max_steps, PUBLIC_BUDGET.max_rows // rows)


def fitting_steps(json_bytes: int) -> int:
    """Steps of `many_steps_file` under the public caps whose JSON stays under `json_bytes` (the
    loader's limit is 32 MiB)."""
    step = len(json.dumps(base_trace()["steps"][0], separators=(",", ":"))) + 4  # larger step numbers
    return min(heaviest_steps(), json_bytes // step)


def piece_table_file(folder: Path, entries: int, used: int = 0) -> Path:
    """A small trace whose piece table (`header.token_text`) has `entries` entries (issue 23).

    With `used`, the sequences use that many distinct token IDs and the table names exactly those:
    the heaviest table a budget that ties entries to the IDs in use can accept.
    """
    data = base_trace()
    data["header"]["schema_version"] = 2
    if used:
        per = used // len(data["sequences"])
        for i, seq in enumerate(data["sequences"]):
            seq["reference_ids"] = list(range(i * per, (i + 1) * per))
            seq["reference_margins"] = None
        data["header"]["target"]["vocab_size"] = max(data["header"]["target"]["vocab_size"], used + 1)
    data["header"]["token_text"] = {str(i): f"t{i % 100}" for i in range(entries)}
    path = folder / f"pieces-{entries}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), 6))
    return path


def session_file(folder: Path) -> Path:
    path = folder / "session-370k.json.gz"
    path.write_bytes(gzip.compress(json.dumps(base_trace(120, 16, 4, 128), separators=(",", ":")).encode()))
    return path


def html_method_file(folder: Path) -> Path:
    data = base_trace()
    data["header"]["method"] = "<img src=x onerror=alert(1)>"
    return write_json(folder / "html-method.json", data)
