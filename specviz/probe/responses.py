"""One server answer, parsed: its text and, where the server gave them, its tokens with logprobs.

Two logprob layouts are in use, on both endpoints:
- legacy (OpenAI completions): `logprobs = {"tokens": [...], "token_logprobs": [...],
  "top_logprobs": [{text: logprob, ...}, ...]}`;
- content (OpenAI chat, and vLLM/SGLang/llama.cpp on completions too): `logprobs = {"content":
  [{"token": ..., "logprob": ..., "top_logprobs": [{"token": ..., "logprob": ...}, ...]}, ...]}`.
A token written `token_id:123` (vLLM's `return_tokens_as_token_ids`) or a `token_ids` list beside
the text gives the token's ID, which the comparison prefers to its text.

Placeholders: a speculative llama-server returns `"logprob": 0.0` with an empty top list for every
token that came from an accepted draft (the target never computed a distribution it kept for
it). A token whose logprob is exactly 0.0 with no alternatives listed (an empty or absent top
list, or one holding only the token itself), or that a server marks (`PLACEHOLDER_MARKERS`), is
kept as a token (its text still counts for the comparison) with no logprob evidence: logprob and
top list None, `placeholder` True. A real certain token has alternatives below it in any top
list of two or more, so nothing real is lost when K >= 2 is asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specviz.errors import SpecvizError
from specviz.probe import telemetry

MAX_TOP = 64  # top logprobs kept per token at most
# Keys a server may set on a content-layout token to say its logprob is not a real one.
PLACEHOLDER_MARKERS = ("placeholder", "draft", "drafted", "is_draft", "speculative")


class ResponseError(SpecvizError):
    """A server answer that is not an OpenAI-compatible completion."""


@dataclass(frozen=True)
class Token:
    text: str
    id: int | None = None
    logprob: float | None = None
    top: tuple[tuple[str, float], ...] | None = None  # best first: (text, logprob)
    placeholder: bool = False  # the server sent a stand-in, not a logprob (see the module doc)

    def key(self, by_id: bool) -> int | str:
        return self.id if by_id and self.id is not None else self.text

    def logprob_of(self, text: str) -> float | None:
        if self.top is None:
            return None
        return next((lp for t, lp in self.top if t == text), None)


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: tuple[Token, ...] | None  # None: the server gave no per-token data
    finish_reason: str | None = None
    telemetry: str | None = None  # the adapter that read drafting counters (telemetry.ADAPTERS)
    drafting: telemetry.Drafting | None = None
    telemetry_error: str | None = None  # counters present but unbelievable (one line)
    cached: bool = False  # the server says it reused a cached prefix of the prompt (`cached_tokens`)
    prompt_tokens: int | None = None  # `usage.prompt_tokens`, where the server says it

    @property
    def has_logprobs(self) -> bool:
        return bool(self.tokens) and any(t.logprob is not None for t in self.tokens)  # type: ignore[union-attr]

    @property
    def placeholders(self) -> int:
        return sum(t.placeholder for t in self.tokens or ())


def parse_answer(payload: Any, endpoint: str) -> Answer:
    """The first choice of a completions or chat response; ResponseError if it is not one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list) or not payload["choices"]:
        raise ResponseError("response has no 'choices'")
    choice = payload["choices"][0]
    if not isinstance(choice, dict):
        raise ResponseError("response choice is not an object")
    if endpoint == "chat":
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ResponseError("response text is not a string")
    tokens = _tokens(choice.get("logprobs"))
    ids = choice.get("token_ids")
    if isinstance(ids, list) and tokens is not None and len(ids) == len(tokens) and all(_is_int(i) for i in ids):
        tokens = tuple(Token(t.text, int(i), t.logprob, t.top) for t, i in zip(tokens, ids))
    finish = choice.get("finish_reason")
    adapter, drafting, error = telemetry.read_response(payload)
    finish = finish if isinstance(finish, str) else None
    usage = payload.get("usage")
    counted = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    prompt_tokens = counted if _is_int(counted) and 0 <= counted <= 10**9 else None
    return Answer(text, tokens, finish, adapter, drafting, error, telemetry.cached_tokens(payload) > 0, prompt_tokens)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == -math.inf:
        return -math.inf
    return None


def _token(text: Any, logprob: Any, top: tuple[tuple[str, float], ...] | None, marked: bool = False) -> Token:
    if not isinstance(text, str):
        raise ResponseError("logprobs token is not a string")
    token_id = None
    if text.startswith("token_id:") and text[9:].isdigit():
        token_id = int(text[9:])
    value = _number(logprob)
    if marked or (value == 0.0 and not any(t != text for t, _ in top or ())):
        return Token(text, token_id, None, None, placeholder=True)
    return Token(text, token_id, value, top)


def _top_pairs(items: list[tuple[Any, Any]]) -> tuple[tuple[str, float], ...]:
    pairs = [(t, lp) for t, lp in ((t, _number(v)) for t, v in items) if isinstance(t, str) and lp is not None]
    pairs.sort(key=lambda p: -p[1])
    return tuple(pairs[:MAX_TOP])


def _tokens(logprobs: Any) -> tuple[Token, ...] | None:
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):  # content layout
        out = []
        for item in logprobs["content"]:
            if not isinstance(item, dict):
                raise ResponseError("logprobs.content item is not an object")
            tops = item.get("top_logprobs")
            top = None
            if isinstance(tops, list):
                top = _top_pairs([(t.get("token"), t.get("logprob")) for t in tops if isinstance(t, dict)])
            marked = any(item.get(k) is True for k in PLACEHOLDER_MARKERS)
            out.append(_token(item.get("token"), item.get("logprob"), top, marked))
        return tuple(out)
    if isinstance(logprobs.get("tokens"), list):  # legacy layout
        texts = logprobs["tokens"]
        lps = logprobs.get("token_logprobs")
        lps = lps if isinstance(lps, list) and len(lps) == len(texts) else [None] * len(texts)
        tops = logprobs.get("top_logprobs")
        tops = tops if isinstance(tops, list) and len(tops) == len(texts) else [None] * len(texts)
        return tuple(
            _token(t, lp, _top_pairs(list(top.items())) if isinstance(top, dict) else None)
            for t, lp, top in zip(texts, lps, tops)
        )
    return None
