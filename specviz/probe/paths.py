"""The compute path of every token, and the noise measured on each pair of paths.

A server computes a token's distribution on one of three paths, with other kernels and other
rounding on each:
- `prompt`: the answer's first token, from the forward over the whole prompt (many rows at once);
- `decode`: one token of this request per forward (alone at concurrency 1; beside other
  requests' rows in a shared decode step at higher concurrency);
- `verify`: one row of a verify chunk, the k+1 tokens a speculative step checks in one forward.
Which path a token took is read where the server says it (a placeholder logprob is a drafted
token, llama.cpp's server gives one for every token of a speculative step) and estimated where it
does not (a server that drafts and gives real logprobs: every token after the first was verified).

A divergence happened between side A's computation at the divergent token and side B's: its pair
of paths, A's first ("decode/verify"). Noise is measured per pair, only where both sides computed
on those paths: margin changes at shared tokens of that pair (compare.py), or the recomputation
(recompute.py: a shared prefix sent again as a prompt, whose last row is computed inside a
multi-token forward like a verify chunk: it stands for `verify`, the nearest path whose logprobs a
server returns). A divergence is judged only against the noise of its own pair; where that was not
measured (too few tokens, or none), the verdict is unattributed, with why and what would measure it.

A pair's noise is the largest of its N measured changes. Were the changes exchangeable draws, a
fresh one would exceed the largest of N with probability 1/(N+1); a flip's margin lies below the
change that flipped it, so a numerical flip is called suspect less often still. MIN_PAIR_TOKENS = 8
keeps that under 1 in 9 and rules out a verdict on one shared token (the false alarm this replaces:
a noise of 1e-05 read from the one token per prompt a speculative llama-server computed alone, used
to judge divergences inside its verify chunks). Every verdict names the pair and N it rests on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PROMPT, DECODE, VERIFY = "prompt", "decode", "verify"
MIN_PAIR_TOKENS = 8  # measured changes a pair needs before a divergence on it is judged (see the doc above)
MIN_PAIR_PROMPTS = 2  # ... from at least this many prompts: never a verdict on one token or one prompt


def token_paths(tokens, drafted: bool) -> tuple[str, ...]:
    """Each token's path: the first from the prompt's forward; a placeholder from a verify chunk;
    the others by decode, except on a side that drafted without placeholders (vLLM, SGLang return
    the verify chunk's own logprobs), where every token after the first was verified (estimated:
    a step with an empty draft decodes one token)."""
    ph = any(t.placeholder for t in tokens)
    verified = drafted and not ph
    return tuple(PROMPT if j == 0 else VERIFY if (t.placeholder or verified) else DECODE for j, t in enumerate(tokens))


def pair(path_a: str, path_b: str) -> str:
    return f"{path_a}/{path_b}"


def describe(key: str) -> str:
    """'decode/verify' -> 'side A decode vs side B verify'."""
    a, _, b = key.partition("/")
    return f"side A {a} vs side B {b}"


def add(into: dict[str, tuple[int, float]], key: str, change: float) -> None:
    """Count one measured margin change on `key`: (tokens, largest change)."""
    n, largest = into.get(key, (0, 0.0))
    into[key] = (n + 1, max(largest, change))


@dataclass(frozen=True)
class PairNoise:
    """The noise of one pair of paths over a run's prompts (those that do not stand out)."""

    pair: str
    tokens: int  # measured margin changes
    prompts: int  # prompts they come from
    estimate: float  # the largest of them
    source: str  # "shared tokens", "recomputed", or both joined by " + "

    @property
    def measured(self) -> bool:
        return self.tokens >= MIN_PAIR_TOKENS and self.prompts >= MIN_PAIR_PROMPTS


def pair_noise(measurements: Iterable[tuple[object, str, dict[str, tuple[int, float]]]]) -> tuple[PairNoise, ...]:
    """Per pair, pooled over (prompt key, source, {pair: (tokens, largest)}) of each prompt: its
    tokens, the distinct prompts they come from, the largest change and the sources."""
    pooled: dict[str, tuple[int, set, float, set]] = {}
    for prompt, source, pairs in measurements:
        for key, (n, largest) in pairs.items():
            tokens, prompts, top, sources = pooled.get(key, (0, set(), 0.0, set()))
            pooled[key] = (tokens + n, prompts | {prompt}, max(top, largest), sources | {source})
    return tuple(
        PairNoise(key, tokens, len(prompts), top, " + ".join(sorted(sources)))
        for key, (tokens, prompts, top, sources) in sorted(pooled.items())
    )


def unmeasured(key: str, noise: PairNoise | None, placeholders: tuple[bool, bool], recomputable: bool) -> str:
    """Why a divergence on `key` has no noise to be judged against, and what would measure it.
    `placeholders`: whether side A, side B carry placeholder logprobs; `recomputable`: whether the
    run could recompute shared prefixes (completions endpoint, logprobs asked)."""
    a, _, b = key.partition("/")
    unseen = VERIFY if VERIFY in (a, b) else DECODE if DECODE in (a, b) else PROMPT  # the path named
    if noise is None:
        sides = [s for s, ph in zip("AB", placeholders) if ph]
        why = (
            f"drafted tokens carry no logprobs (placeholders on side {' and '.join(sides)})"
            if VERIFY in (a, b) and sides
            else "no shared token was computed on these paths"
        )
    else:
        why = (
            f"measured on {noise.tokens} tokens of {noise.prompts} prompts "
            f"(at least {MIN_PAIR_TOKENS} tokens of {MIN_PAIR_PROMPTS} prompts needed)"
        )
    if recomputable and VERIFY in (a, b):
        command = "rerun with more prompts (--num-prompts 32) or --calibrate 8"
    elif VERIFY in (a, b):
        command = "rerun on the completions endpoint with --logprobs 5 and --calibrate 4, or with --replay MODEL_PATH"
    else:
        command = "rerun with more prompts (--num-prompts 32), or with --replay MODEL_PATH"
    return f"the {unseen} path's noise was not measured ({describe(key)}): {why}; to measure it, {command}"
