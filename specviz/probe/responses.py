"""One server answer, parsed: its text and, where the server gave them, its tokens with logprobs.

Two logprob layouts are in use, on both endpoints:
- legacy (OpenAI completions): `logprobs = {"tokens": [...], "token_logprobs": [...],
  "top_logprobs": [{text: logprob, ...}, ...]}`;
- content (OpenAI chat, and vLLM/SGLang/llama.cpp on completions too): `logprobs = {"content":
  [{"token": ..., "logprob": ..., "top_logprobs": [{"token": ..., "logprob": ...}, ...]}, ...]}`.
A token written `token_id:123` (vLLM's `return_tokens_as_token_ids`) or a `token_ids` list beside
the text gives the token's ID, which the comparison prefers to its text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specviz.errors import SpecvizError

MAX_TOP = 64  # top logprobs kept per token at most


class ResponseError(SpecvizError):
    """A server answer that is not an OpenAI-compatible completion."""


@dataclass(frozen=True)
class Token:
    text: str
    id: int | None = None
    logprob: float | None = None
    top: tuple[tuple[str, float], ...] | None = None  # best first: (text, logprob)

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

    @property
    def has_logprobs(self) -> bool:
        return bool(self.tokens) and self.tokens[0].logprob is not None  # type: ignore[index]


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
    return Answer(text, tokens, finish if isinstance(finish, str) else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == -math.inf:
        return -math.inf
    return None


def _token(text: Any, logprob: Any, top: tuple[tuple[str, float], ...] | None) -> Token:
    if not isinstance(text, str):
        raise ResponseError("logprobs token is not a string")
    token_id = None
    if text.startswith("token_id:") and text[9:].isdigit():
        token_id = int(text[9:])
    return Token(text, token_id, _number(logprob), top)


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
            out.append(_token(item.get("token"), item.get("logprob"), top))
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
