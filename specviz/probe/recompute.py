"""The verify path's noise, measured on the servers themselves: shared prefixes recomputed.

A speculative llama-server returns no logprob for a token it computed inside a verify chunk (a
placeholder), and no server-independent API returns the logprobs of prompt tokens (llama.cpp's
server rejects `echo`), so the noise of the verify path cannot be read from the answers. It can be
measured: the prompt plus an answer's first j shared tokens is sent again, as a prompt, for one
token. The server computes that token's distribution as the last row of a forward over the whole
prompt, many tokens of one sequence at once, as in a verify chunk (other kernels and rounding
than a one-token decode); its margin against the same position's margin as the other side
computed it is the noise between the two paths, at that position, on that server.

Per recomputed position j (A's and B's token there are the same, `t`):
    A's own token  vs B recomputed  -> pair "<A's path>/verify"
    A recomputed   vs B's own token -> pair "verify/<B's path>"
    A recomputed   vs B recomputed  -> pair "verify/verify", and "prompt/prompt" (literally that)
where an own token counts only with a real logprob (not a placeholder). Side B's recomputation is
sent as a batch of copies of itself at B's concurrency (at most COPIES): the server's batched
kernels, with nothing a batch's composition could change (every row the same length and tokens),
so a position, padding or row-mixing bug cannot act on the calibration and lend itself noise.
Side A's is sent alone. `cache_prompt: false` asks the server to compute the whole prompt (a
reused prefix would leave a one-token decode); an answer that says it reused a cache, whose prompt
was tokenized otherwise (`usage.prompt_tokens` not the original's plus j), or whose top list lacks
`t` (another context) is not a measurement.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from specviz.probe import paths
from specviz.probe.client import Client
from specviz.probe.compare import Evidence, drafted, margin, margin_change
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer, Token

COPIES = 4  # side B's recomputation: a batch of this many copies (at most its concurrency)
MAX_PROMPTS = 8  # prompts recomputed per concurrency level in a run (each costs positions x (1 + copies))


def positions(ev: Evidence, a: Answer, b: Answer, wanted: int, any_path: bool = False) -> list[int]:
    """Up to `wanted` shared positions after the first (the prompt's own row is not recomputed),
    evenly spread, among those where either side's token took the verify path; `any_path`: among
    all of them (a divergence at the first token needs the prompt path's noise, which any
    recomputed position measures)."""
    if a.tokens is None or b.tokens is None or wanted <= 0:
        return []
    shared = ev.divergence if ev.divergence is not None else min(len(a.tokens), len(b.tokens))
    pa = paths.token_paths(a.tokens, drafted(a))
    pb = paths.token_paths(b.tokens, drafted(b))
    candidates = [j for j in range(1, shared) if any_path or paths.VERIFY in (pa[j], pb[j])]
    if len(candidates) <= wanted:
        return candidates
    step = len(candidates) / wanted
    return [candidates[int(k * step)] for k in range(wanted)]


def _valid(answer: Answer, shared: Token, expected_prompt_tokens: int | None) -> Token | None:
    """The recomputed token, where it measures what it should (the module doc), else None."""
    if answer.cached or not answer.tokens:
        return None
    first = answer.tokens[0]
    if first.placeholder or first.top is None or len(first.top) < 2 or first.logprob_of(shared.text) is None:
        return None
    if expected_prompt_tokens is not None and answer.prompt_tokens not in (None, expected_prompt_tokens):
        return None
    return first


def measure(
    items: list[tuple[Evidence, Answer, Answer, Prompt]],
    side_a: Client,
    side_b: Client,
    pool_b: ThreadPoolExecutor,
    copies: int,
    wanted: int,
    budget: int,
) -> int:
    """Recompute up to `wanted` positions of up to `budget` prompts (diverged ones first) and add
    the margin changes to each Evidence's `recomputed`; returns the prompts recomputed. Only where
    a side verified, or where a prompt diverged at its first token (`positions`)."""
    order = sorted(items, key=lambda item: item[0].divergence is None)
    first_token = any(ev.pair == paths.pair(paths.PROMPT, paths.PROMPT) for ev, _, _, _ in items)
    used = 0
    for ev, a, b, prompt in order:
        if used >= budget:
            break
        points = positions(ev, a, b, wanted, any_path=first_token)
        if not points:
            continue
        used += 1
        pa, pb = paths.token_paths(a.tokens, drafted(a)), paths.token_paths(b.tokens, drafted(b))
        for j in points:
            again = Prompt(text=prompt.as_text() + "".join(t.text for t in a.tokens[:j]))
            expected = a.prompt_tokens + j if a.prompt_tokens is not None else None
            a_re = _valid(side_a.complete(again, max_tokens=1, fresh=True), a.tokens[j], expected)
            sent = list(pool_b.map(lambda p: side_b.complete(p, max_tokens=1, fresh=True), [again] * copies))
            b_re = [t for t in (_valid(x, a.tokens[j], expected) for x in sent) if t is not None]
            _add(ev, a.tokens[j], b.tokens[j], pa[j], pb[j], a_re, b_re)
    return used


def _add(ev: Evidence, own_a: Token, own_b: Token, path_a: str, path_b: str, a_re: Token | None, b_re: list) -> None:
    """The changes at one position; the verify class only where a side verified there (else the
    recomputation measured the prompt path alone: a divergence at a first token)."""
    verified = paths.VERIFY in (path_a, path_b)
    for other in b_re:
        if verified and margin(own_a) is not None:
            _count(ev, paths.pair(path_a, paths.VERIFY), margin_change(own_a, other))
        if a_re is not None:  # two rows of prompt forwards: literally the prompt path, and the verify class
            change = margin_change(a_re, other)
            _count(ev, paths.pair(paths.PROMPT, paths.PROMPT), change)
            if verified:
                _count(ev, paths.pair(paths.VERIFY, paths.VERIFY), change)
    if verified and a_re is not None and margin(own_b) is not None:
        _count(ev, paths.pair(paths.VERIFY, path_b), margin_change(a_re, own_b))


def _count(ev: Evidence, key: str, change: float | None) -> None:
    if change is not None:
        paths.add(ev.recomputed, key, change)
