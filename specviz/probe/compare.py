"""Two answers to one prompt, compared token by token: where they part, and the evidence.

Terms, pinned once:
- side A is the reference (the prompt sent alone, or server A), side B the one under test;
- the shared prefix is the tokens both sides emitted identically, before the first divergent one;
- a token's margin is its top-1 minus top-2 logprob on one side; the margin change at a shared
  token is |margin_A - margin_B| (|logprob_A - logprob_B| when a side lists fewer than 2 tops):
  how far the two computations moved apart at a place where they still agreed;
- at the divergent token (A chose a, B chose b) the gap on A is logprob_A(a) - logprob_A(b), the
  gap on B is logprob_B(b) - logprob_B(a), and the swing is their sum: how far the a-vs-b
  difference moved between the sides. A top-1 minus top-2 margin is the smallest gap a flip needs.
Placeholder tokens (responses.py: drafted tokens a speculative server sends without a logprob)
still count as tokens for where the answers part, but give no margin change and no gap: they are
left out of the noise and of the attribution, and counted.
Only per-prompt summaries leave this module (no token lists), so a run of 10,000 prompts keeps
O(prompts) numbers, not responses.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from specviz.probe import paths
from specviz.probe.responses import Answer, Token
from specviz.probe.scans import scan

END = "<end of answer>"  # the token text shown where one side stopped
# How servers spell end-of-sequence in top logprobs: where one side stopped, the other side's gap
# is measured to this token when its top list has it.
EOS_TEXTS = frozenset(
    ["</s>", "<|endoftext|>", "<|im_end|>", "<eos>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>"]
)
CONTEXT_CHARS = 80


@dataclass(frozen=True)
class Shown:
    """A token as the report shows it: text, ID where known, and its logprobs on both sides."""

    text: str
    id: int | None = None
    logprob_a: float | None = None
    logprob_b: float | None = None


@dataclass
class Evidence:
    """One prompt's comparison, summarized."""

    index: int
    length_a: int
    length_b: int
    unit: str  # "token" (the servers' tokens or the replay tokenizer's) or "char" (no tokens known)
    divergence: int | None = None  # first divergent index, None when identical
    token_a: Shown | None = None
    token_b: Shown | None = None
    context: str = ""  # the shared text just before the divergence
    prefix_tokens: int = 0  # shared tokens with a margin change measured
    prefix_median: float | None = None  # the prompt's typical margin change (its level)
    prefix_max: float | None = None  # its largest margin change
    gap_a: float | None = None
    gap_b: float | None = None
    top_margin_a: float | None = None  # A's top-1 minus top-2 at the divergent token
    lower_bound: bool = False  # a gap is a bound: the other token is not in that side's top list
    source: str = "server"  # where the logprob evidence comes from: "server", "replay" or "none"
    placeholders_a: int = 0  # tokens of each answer that carry a placeholder, not a logprob
    placeholders_b: int = 0
    placeholder_at_divergence: bool = False  # a side's token there is a placeholder
    path: str = "plain"  # the path the server reports it took (see `path_of`)
    findings: tuple[tuple[str, str], ...] = ()  # scans.scan of side B against side A
    round: int = 0  # the round (--rounds) this comparison is from
    resolution: float = 0.0  # the smallest margin change the evidence can show (replay: a dtype step)
    rescored: bool = False  # the gap on A comes from the shared prefix sent again, alone (`rescore`)
    prefix_text: str | None = None  # the whole shared text, kept only until it is rescored
    # The divergence's pair of compute paths, A's first ("decode/verify", paths.py); None where the
    # paths are not known (characters, or the replay's tokens: both sides recomputed alike)
    pair: str | None = None
    pairs: dict[str, tuple[int, float]] = field(default_factory=dict)  # per pair: (shared tokens, largest change)
    recomputed: dict[str, tuple[int, float]] = field(default_factory=dict)  # the same from recompute.py

    @property
    def swing(self) -> float | None:
        """gap_a + gap_b; one of them alone where a side stopped (servers return no logprobs for
        the end-of-sequence step, so the stopped side's distribution there is unknown)."""
        if self.gap_a is None and self.gap_b is None:
            return None
        return (self.gap_a or 0.0) + (self.gap_b or 0.0)


def units(answer: Answer, tokenize=None) -> tuple[list[Token], str]:
    """The answer as a list of comparable units: its tokens, the tokenizer's, or its characters."""
    if answer.tokens is not None and (answer.tokens or not answer.text):
        return list(answer.tokens), "token"
    if tokenize is not None:
        return list(tokenize(answer.text)), "token"
    return [Token(c) for c in answer.text], "char"


def margin(token: Token) -> float | None:
    if token.top is None or len(token.top) < 2:
        return None
    return token.top[0][1] - token.top[1][1]


def margin_change(a: Token, b: Token) -> float | None:
    ma, mb = margin(a), margin(b)
    if ma is not None and mb is not None:
        return abs(ma - mb)
    if a.logprob is not None and b.logprob is not None:
        return abs(a.logprob - b.logprob)
    return None


def gap(side: Token, mine: str, other: str | None) -> tuple[float | None, bool]:
    """logprob(mine) - logprob(other) on this side's distribution; (bound, True) when `other` is
    not in its top list (the gap is at least the distance to the last listed token)."""
    if side.top is None or not side.top:
        return None, False
    own = side.logprob if side.logprob is not None else side.logprob_of(mine)
    if own is None:
        return None, False
    candidates = EOS_TEXTS if other is None else (other,)
    theirs = next((lp for t, lp in side.top if t in candidates), None)
    if theirs is not None:
        return own - theirs, False
    if len(side.top) < 2:
        return None, False
    return own - side.top[-1][1], True


def drafted(answer: Answer) -> bool:
    """The server says this answer was drafted: counters, or placeholders for accepted drafts."""
    return (answer.drafting is not None and (answer.drafting.drafted or 0) > 0) or answer.placeholders > 0


def _paths(answer: Answer, tokens: list[Token]) -> tuple[str, ...] | None:
    """Each token's compute path (paths.token_paths), where the tokens are the server's own."""
    if answer.tokens is None or len(tokens) != len(answer.tokens):
        return None
    return paths.token_paths(tokens, drafted(answer))


def _path_at(side: tuple[str, ...], j: int, answer: Answer) -> str:
    """The path of token j, or of the end-of-sequence step just past the answer's last token."""
    if j < len(side):
        return side[j]
    return paths.PROMPT if j == 0 else paths.VERIFY if drafted(answer) else paths.DECODE


def path_of(a: Answer, b: Answer) -> str:
    """The computational path the server reports for this prompt, as a group key for the noise:
    "drafted" when either side drafted (telemetry counts drafts, or placeholders show accepted
    ones), else "plain"; "+cached" when either side says it reused a cached prefix. Prompts on
    another path have another noise level; each is judged against prompts on its own path
    (attribution.py)."""
    return ("drafted" if drafted(a) or drafted(b) else "plain") + ("+cached" if a.cached or b.cached else "")


def compare(index: int, a: Answer, b: Answer, tokenize=None, prompt: str = "", rescorable: bool = False) -> Evidence:
    """The evidence for one prompt; `tokenize` maps text to tokens when a side gave none;
    `rescorable` keeps the shared text of a divergence on placeholders for `rescore`."""
    ua, kind_a = units(a, tokenize)
    ub, kind_b = units(b, tokenize)
    unit = "token" if kind_a == kind_b == "token" else "char"
    if unit == "char":
        ua, ub = [Token(c) for c in a.text], [Token(c) for c in b.text]
    by_id = all(t.id is not None for t in ua + ub)
    n = min(len(ua), len(ub))
    d = next((j for j in range(n) if ua[j].key(by_id) != ub[j].key(by_id)), None)
    if d is None and len(ua) != len(ub):
        d = n
    ev = Evidence(index, len(ua), len(ub), unit)
    ev.placeholders_a, ev.placeholders_b, ev.path = a.placeholders, b.placeholders, path_of(a, b)
    ev.findings = scan(prompt, a.text, b.text)
    pa, pb = (_paths(a, ua), _paths(b, ub)) if unit == "token" else (None, None)
    deltas = []
    for j in range(n if d is None else d):
        change = margin_change(ua[j], ub[j])
        if change is not None:
            deltas.append(change)
            if pa is not None and pb is not None:
                paths.add(ev.pairs, paths.pair(pa[j], pb[j]), change)
    if deltas:
        ev.prefix_tokens = len(deltas)
        ev.prefix_median = statistics.median(deltas)
        ev.prefix_max = max(deltas)
    if d is None:
        return ev
    ev.divergence = d
    if pa is not None and pb is not None:
        ev.pair = paths.pair(_path_at(pa, d, a), _path_at(pb, d, b))
    ta, tb = (ua[d] if d < len(ua) else None), (ub[d] if d < len(ub) else None)
    ev.context = "".join(t.text for t in ua[:d])[-CONTEXT_CHARS:]
    gap_a, bound_a = gap(ta, ta.text, tb.text if tb else None) if ta else (None, False)
    gap_b, bound_b = gap(tb, tb.text, ta.text if ta else None) if tb else (None, False)
    ev.gap_a, ev.gap_b, ev.lower_bound = gap_a, gap_b, bound_a or bound_b
    ev.top_margin_a = margin(ta) if ta else None
    ev.token_a = _shown(ta, ta, tb)
    ev.token_b = _shown(tb, ta, tb)
    ev.source = "server" if gap_a is not None or gap_b is not None else "none"
    ev.placeholder_at_divergence = bool((ta and ta.placeholder) or (tb and tb.placeholder))
    if rescorable and ev.placeholder_at_divergence and gap_a is None:
        ev.prefix_text = "".join(t.text for t in ua[:d])
    return ev


def rescore(ev: Evidence, first: Token) -> None:
    """Fill the gap on A from `first`, the first token the server answered when sent the prompt
    plus the shared prefix alone: a completion's first token is sampled by the target itself,
    never a placeholder, so its logprobs are the reference's at the divergent position."""
    ev.prefix_text = None
    if first.placeholder or first.top is None or ev.token_a is None:
        return
    a = ev.token_a.text
    b = None if ev.token_b is None or ev.token_b.text == END else ev.token_b.text
    own = first.logprob if first.text == a else first.logprob_of(a)
    if a == END:
        own = next((lp for t, lp in first.top if t in EOS_TEXTS), None)
    if own is None or b == a:
        return
    candidates = EOS_TEXTS if b is None else (b,)
    theirs = next((lp for t, lp in first.top if t in candidates), None)
    if theirs is None:
        if len(first.top) < 2:
            return
        theirs, ev.lower_bound = first.top[-1][1], True
    ev.gap_a, ev.rescored, ev.source = own - theirs, True, "server"
    if ev.pair is not None:  # A's margin now comes from a row of a prompt's forward: the verify class
        ev.pair = paths.pair(paths.VERIFY, ev.pair.partition("/")[2])


def _shown(token: Token | None, ta: Token | None, tb: Token | None) -> Shown:
    """`token` with its logprob on side A (`ta` is A's token there) and on side B."""
    if token is None:
        return Shown(END)

    def on(side: Token | None) -> float | None:
        if side is None:
            return None
        return side.logprob if side.text == token.text else side.logprob_of(token.text)

    return Shown(token.text, token.id, on(ta), on(tb))
