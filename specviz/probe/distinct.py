"""`specviz probe URL --distinct N`: N byte-identical greedy requests sent together; one answer
expected.

Copies of one prompt in one batch have nothing to tell them apart: the same tokens, the same
length, the same sampling (greedy). A server that gives them different answers leaked something
between its slots or rows (llama.cpp #28286: one request's output drifted into another's). So
more than one distinct answer is a finding, with where the answers split and which copies share
which text. Each group of identical answers is compared with the largest one (the majority; ties:
the group of the lowest copy): the first token where it departs, both tokens there, the text
they share before it, and the majority's margin at that token (top-1 minus top-2 logprob) where
the server gave a real logprob. A near-tie margin does not clear the finding: copies of one
prompt in one batch share every input, so a correct engine computes them alike; it says how
little it took.

Placeholder logprobs (drafted tokens, specviz.probe.responses) are tokens like any other here:
answers are compared by token (ID where the server gives one, else text), or by character where
the server gives no tokens; a placeholder only means the margin at that token is unknown.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from specviz.probe.client import Client
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer

FORMAT = "specviz-probe-distinct"
VERSION = 1
MAX_COPIES = 256
RELEASE_TIMEOUT_S = 30.0  # the copies wait at a barrier so they leave together


@dataclass(frozen=True)
class Group:
    """Copies that gave the same answer."""

    copies: tuple[int, ...]  # which copies (0-based, in the order they were sent)
    text: str  # the answer (first 200 characters)
    length: int  # in `unit`s
    split: int | None  # where it departs from the majority (None: the majority itself)
    token: str | None  # its token there ('' past its end)
    majority_token: str | None  # the majority's token there
    margin: float | None  # the majority's top-1 minus top-2 logprob there (None: unknown)
    shared: str  # the text both share before the split (last 80 characters)


@dataclass(frozen=True)
class DistinctPrompt:
    index: int
    prompt: str  # a preview
    copies: int
    unit: str  # token | char
    groups: tuple[Group, ...]  # the majority first

    @property
    def distinct(self) -> int:
        return len(self.groups)


@dataclass(frozen=True)
class DistinctReport:
    format: str
    version: int
    created: str
    url: str
    model: str | None
    copies: int
    max_tokens: int
    verdict: str  # identical | distinct
    prompts: tuple[DistinctPrompt, ...]
    placeholders: int  # tokens that carried a placeholder instead of a logprob
    tokens: int

    @property
    def failed(self) -> bool:
        return self.verdict == "distinct"


def send_copies(side: Client, prompt: Prompt, copies: int) -> list[Answer]:
    """`copies` requests of `prompt`, released together from a barrier (one batch for the server)."""
    barrier = threading.Barrier(copies)

    def one(_: int) -> Answer:
        with contextlib.suppress(threading.BrokenBarrierError):  # a late thread: send anyway
            barrier.wait(RELEASE_TIMEOUT_S)
        return side.complete(prompt)

    with ThreadPoolExecutor(copies, thread_name_prefix="probe-distinct") as pool:
        return list(pool.map(one, range(copies)))


def _keys(answer: Answer, by_id: bool) -> tuple:
    if answer.tokens is None:
        return tuple(answer.text)
    return tuple(t.key(by_id) for t in answer.tokens)


def _split(a: tuple, b: tuple) -> int:
    """The first index where two answers differ (the shorter one's length if one extends the other)."""
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _margin(answer: Answer, j: int) -> float | None:
    if answer.tokens is None or j >= len(answer.tokens):
        return None
    top = answer.tokens[j].top
    return top[0][1] - top[1][1] if top and len(top) >= 2 else None


def _piece(answer: Answer, j: int) -> str:
    if answer.tokens is None:
        return answer.text[j : j + 1]
    return answer.tokens[j].text if j < len(answer.tokens) else ""


def _text_before(answer: Answer, j: int) -> str:
    if answer.tokens is None:
        return answer.text[:j][-80:]
    return "".join(t.text for t in answer.tokens[:j])[-80:]


def compare_copies(index: int, prompt: Prompt, answers: list[Answer]) -> DistinctPrompt:
    """Group the copies' answers; each group's split from the majority."""
    tokens = all(a.tokens is not None for a in answers)
    by_id = tokens and all(t.id is not None for a in answers for t in a.tokens or ())
    keys = [_keys(a, by_id) if tokens else tuple(a.text) for a in answers]
    members: dict[tuple, list[int]] = {}
    for copy, key in enumerate(keys):
        members.setdefault(key, []).append(copy)
    ordered = sorted(members.items(), key=lambda item: (-len(item[1]), item[1][0]))
    majority_key, majority_copies = ordered[0]
    majority = answers[majority_copies[0]]
    groups = []
    for key, copies in ordered:
        answer = answers[copies[0]]
        split = None if key == majority_key else _split(majority_key, key)
        groups.append(
            Group(
                tuple(copies), answer.text[:200], len(key), split,
                None if split is None else (_piece(answer, split) if tokens else answer.text[split : split + 1]),
                None if split is None else (_piece(majority, split) if tokens else majority.text[split : split + 1]),
                None if split is None else _margin(majority, split),
                "" if split is None else (_text_before(majority, split) if tokens else majority.text[:split][-80:]),
            )
        )  # fmt: skip
    return DistinctPrompt(index, prompt.preview(), len(answers), "token" if tokens else "char", tuple(groups))


def run_distinct(side: Client, prompts: list[Prompt], copies: int, url: str) -> DistinctReport:
    if not 2 <= copies <= MAX_COPIES:
        raise ValueError(f"--distinct must be between 2 and {MAX_COPIES}")
    results, placeholders, count = [], 0, 0
    for index, prompt in enumerate(prompts):
        answers = send_copies(side, prompt, copies)
        placeholders += sum(a.placeholders for a in answers)
        count += sum(len(a.tokens or ()) for a in answers)
        results.append(compare_copies(index, prompt, answers))
    verdict = "distinct" if any(p.distinct > 1 for p in results) else "identical"
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return DistinctReport(
        FORMAT, VERSION, created, url, side.model, copies, side.max_tokens, verdict, tuple(results), placeholders, count
    )


def _copies(copies: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, copies[:12])) + (f" and {len(copies) - 12} more" if len(copies) > 12 else "")
    return f"cop{'y' if len(copies) == 1 else 'ies'} {shown}"


def render(report: DistinctReport) -> str:
    split = [p for p in report.prompts if p.distinct > 1]
    lines = [
        f"probe --distinct: {report.copies} identical greedy requests of each prompt sent together to {report.url}, "
        f"{len(report.prompts)} prompts",
        f"verdict: {report.verdict.upper()}   {len(split)} of {len(report.prompts)} prompts got more than one answer",
    ]
    if report.placeholders:
        lines.append(
            f"{report.placeholders} of {report.tokens} tokens carry no logprob (drafted tokens): compared by token, "
            "their margins unknown"
        )
    for p in split:
        majority = p.groups[0]
        lines.append(f"  #{p.index}: {p.distinct} distinct answers; the majority, {_copies(majority.copies)}")
        for g in p.groups[1:]:
            margin = "unknown" if g.margin is None else f"{g.margin:.3g}"
            lines.append(
                f"    {_copies(g.copies)} split at {p.unit} {g.split}: {g.token!r} vs the majority's "
                f"{g.majority_token!r} (majority's margin there {margin}), after {g.shared!r}"
            )
    if split:
        lines.append(
            "next: copies of one prompt in one batch share every input: a different answer means state leaked between "
            "slots or rows (KV cache slots, a reused slot's stale state, row indexing). Rerun with fewer copies to "
            "find the smallest batch that splits, and with --concurrency 1,N to see how often it happens"
        )
    return "\n".join(lines)
