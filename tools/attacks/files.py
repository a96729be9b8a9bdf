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


EMOJI = "\U0001f600"  # 4 bytes in UTF-8 and 4 in a Python string: text a character count underrates


def hidden_memory_file(
    folder: Path,
    runs: int = 500_000,
    options: int = 16_000,
    option_chars: int = 160,
    piece_chars: int = 1_000_000,
    level: int = 9,
) -> Path:
    """Issue 34: a ~100 KB gzip inside the public budget that keeps ~100 MB once loaded, in what an
    estimate of rows and tokens leaves out: `runs` mask runs, `options` header options of long emoji
    strings, and a piece table of 4 entries of `piece_chars` emoji each (IDs the trace uses)."""
    data = base_trace()
    data["header"]["schema_version"] = 2
    step = data["steps"][0]
    rows = 128  # at most 4,096 runs a row: 128 rows carry 500,000
    data["steps"] = [{**step, "step": i, "rows": step["rows"]} for i in range(rows // len(step["rows"]))]
    per_row = runs // rows
    for s in data["steps"]:
        s["cache_len"] = per_row * 2 - s["query_len"]
        s["rows"] = [{**row, "mask_rle": [[1, 1], [0, 1]] * (per_row // 2)} for row in s["rows"]]
    data["header"]["options"] = {f"o{i:05d}": EMOJI * option_chars for i in range(options)}
    used = sorted({t for seq in data["sequences"] for t in seq["output_ids"]})[:4]
    data["header"]["token_text"] = {str(t): EMOJI * piece_chars for t in used}
    path = folder / "hidden-memory.json.gz"
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    path.write_bytes(gzip.compress(text.encode(), level))  # 9: ~100 KB; 1 (tests): faster, larger
    return path


def probe_report_file(folder: Path, prompts: int) -> Path:
    """The bundled probe report with its prompts repeated to `prompts` (counts kept consistent)."""
    from specviz.app.loading import TRACES

    data = json.loads((TRACES / "probe-example.json").read_text())
    base = data["prompts"]
    data["prompts"] = [{**json.loads(json.dumps(base[i % len(base)])), "index": i} for i in range(prompts)]
    data["counts"] = {key: 0 for key in data["counts"]}
    for prompt in data["prompts"]:
        data["counts"][prompt["verdict"]] = data["counts"].get(prompt["verdict"], 0) + 1
    return write_json(folder / f"probe-{prompts}.json", data)


HOSTILE_REPORT_TEXT = (
    "![x](http://93.184.215.14/pixel.png) [click](javascript:alert(1)) <img src=x onerror=alert(1)>"
    " <a href=http://93.184.215.14/>a</a>"
)


def hostile_probe_report_file(folder: Path, prompts: int) -> Path:
    """Issue 34: a probe report of `prompts` prompts whose free-text fields (side labels, models,
    prompt texts and reasons; the noise source is an enumeration, refused if not one of it) carry
    a Markdown image, a `javascript:` link and raw HTML: none of it may load anything into a
    visitor's page."""
    path = probe_report_file(folder, prompts)
    data = json.loads(path.read_text())
    for side in ("side_a", "side_b"):
        data[side]["label"] = data[side]["model"] = HOSTILE_REPORT_TEXT
    for prompt in data["prompts"]:
        prompt["prompt"] = HOSTILE_REPORT_TEXT + " " + str(prompt["prompt"])
        prompt["reason"] = HOSTILE_REPORT_TEXT
    return write_json(folder / f"probe-hostile-{prompts}.json", data)


# ----------------------------------------------------------------------------- issue 43: drawing costs


def _schema3(data: dict[str, Any]) -> dict[str, Any]:
    data["header"]["schema_version"] = 3
    return data


def _token_texts(data: dict[str, Any], chars: int) -> None:
    """A piece table naming every token ID the trace uses, each `chars` characters long."""
    used: set[int] = set()
    for seq in data["sequences"]:
        for name in ("prompt_ids", "output_ids", "reference_ids"):
            used.update(seq.get(name) or ())
    for step in data["steps"]:
        for row in step["rows"]:
            used.update([row["pending_token"], *row["draft_tokens"], *row["target_tokens"], *row["emitted"]])
    hostile = "<b>{t}</b>![x](http://93.184.215.14/{t}.png)"
    data["header"]["token_text"] = {str(t): (hostile.format(t=t) * chars)[:chars] for t in sorted(used)}


def wide_step_file(folder: Path, rows: int = 1024, query: int = 64, text_chars: int = 590) -> Path:
    """Issue 43, attack 3: one step of `rows` rows x `query` query slots (the public budget's
    1,024 x 64 cells), every token's text `text_chars` characters: a ~20 KB gzip."""
    from specviz.trace.io import trace_to_dict
    from specviz.trace.synthetic import synthetic_trace

    data = _schema3(trace_to_dict(synthetic_trace(rows, rows, query - 1, 2)))
    data["steps"] = data["steps"][:1]
    _token_texts(data, text_chars)
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    path = folder / f"wide-{rows}x{query}.json.gz"
    path.write_bytes(gzip.compress(text.encode(), 9))
    return path


def star_tree(row: dict[str, Any], nodes: int) -> None:
    """Make `row` a star tree of `nodes` nodes (every draft a child of the root), each node
    attending the root and itself: the most nodes a row may carry for the fewest list items."""
    drafts = (row["draft_tokens"] * nodes)[: nodes - 1] or [1] * (nodes - 1)
    row["draft_tokens"] = drafts
    row["target_tokens"] = (row["target_tokens"] * nodes)[:nodes]
    n = row["committed_before"]
    row["position_ids"] = [n - 1] + [n] * (nodes - 1)
    row["tree_parents"] = [-1] + [0] * (nodes - 1)
    row["tree_depths"] = [0] + [1] * (nodes - 1)
    row["node_attends"] = [[0]] + [[0, i] for i in range(1, nodes)]
    row["accepted"] = min(row["accepted"], 1)
    row["tree_path"] = [1] if row["accepted"] else []
    row["kept_nodes"] = [0, *row["tree_path"]]


def big_trees_file(folder: Path, steps: int = 3, rows: int = 255, nodes: int = 257) -> Path:
    """Issue 43, attack 5: `steps` steps of `rows` rows of `nodes`-node trees (the public budget's
    widest: 255 x 257 query cells a step)."""
    from specviz.trace.io import trace_to_dict
    from specviz.trace.synthetic import synthetic_trace

    data = _schema3(trace_to_dict(synthetic_trace(rows, rows, 3, 3 * steps)))
    data["steps"] = data["steps"][:steps]
    data["header"]["tree_branches"] = nodes - 1
    for step in data["steps"]:
        step["query_len"] = nodes
        for row in step["rows"]:
            star_tree(row, nodes)
    path = folder / f"trees-{steps}x{rows}x{nodes}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), 9))
    return path
