"""The noise per compute path (specviz/probe/paths.py) on hand-built answers: which path each
token took, which pair of paths a divergence happened on, and that a divergence is judged only
against the noise measured on its own pair (else unattributed, saying why and what measures it).

The oracle is how the answers are built: side A computed every token one at a time (real
logprobs, margins known), side B like a speculative llama-server (the first token real, every
other a placeholder); the pair of a divergence and the tokens measured on each pair follow."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specviz.probe import paths, recompute
from specviz.probe.attribution import decide, estimate_noise
from specviz.probe.client import Client, Endpoint, InFlightClock
from specviz.probe.compare import Evidence, compare
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer, Token
from specviz.probe.telemetry import Drafting

WORDS = [f" w{i}" for i in range(24)]


def real(text: str, margin: float, other: str = " x") -> Token:
    """A token with a real logprob, chosen `margin` nats over its runner-up `other`."""
    return Token(text, None, -0.1, ((text, -0.1), (other, -0.1 - margin), (" z", -5.0)))


def placeholder(text: str) -> Token:
    return Token(text, placeholder=True)


def plain(words: list[str], margins: list[float]) -> Answer:
    return Answer("".join(words), tuple(real(w, m) for w, m in zip(words, margins)))


def llama_drafted(words: list[str], first_margin: float) -> Answer:
    """A speculative llama-server's answer: the first token real, all others placeholders."""
    tokens = (real(words[0], first_margin), *(placeholder(w) for w in words[1:]))
    return Answer("".join(words), tokens, drafting=Drafting(len(words), len(words) - 1))


def llama_case(prompts: int = 16, at: int = 10) -> list[Evidence]:
    """Side A plain, side B self-drafting: the first token computed identically on both (margin
    change 0), B's answer parts from A's at token `at` of prompt 0 (A's margin there 0.05)."""
    evs = []
    for i in range(prompts):
        margins = [1.0] * len(WORDS)
        b_words = list(WORDS)
        if i == 0:
            margins[at] = 0.05
            b_words[at] = " x"  # A's runner-up: a flip of a near-tie
        evs.append(compare(i, plain(WORDS, margins), llama_drafted(b_words, 1.0)))
    return evs


def test_token_paths_read_placeholders_and_drafting() -> None:
    """llama.cpp marks every token of a speculative step (a placeholder): the real ones after the
    first were decoded alone. A server that drafts and gives real logprobs (vLLM) verified every
    token after the first. A plain answer decodes."""
    b = llama_drafted(WORDS[:4], 1.0)
    assert paths.token_paths(b.tokens, True) == ("prompt", "verify", "verify", "verify")
    mixed = (real(" a", 1.0), placeholder(" b"), real(" c", 1.0))
    assert paths.token_paths(mixed, True) == ("prompt", "verify", "decode")
    vllm = tuple(real(w, 1.0) for w in WORDS[:3])
    assert paths.token_paths(vllm, True) == ("prompt", "verify", "verify")
    assert paths.token_paths(vllm, False) == ("prompt", "decode", "decode")


def test_a_verify_divergence_against_noise_measured_alone_is_unattributed_not_suspect() -> None:
    """The false alarm of issue 42: the only shared tokens with logprobs on both sides are the first
    of each answer (one per prompt, computed identically: change 0, noise 1e-05). Judged against
    them, A's margin 0.05 at a token B computed inside a verify chunk read as suspect. That noise
    was measured on another path: the divergence is unattributed, saying why and what measures it."""
    evs = llama_case()
    assert evs[0].pair == "decode/verify" and evs[0].pairs == {"prompt/prompt": (1, 0.0)}
    noise = estimate_noise(evs, recomputable=True)
    verdict, reason = decide(evs[0], noise)
    assert verdict == "unattributed", reason
    assert reason.startswith("the verify path's noise was not measured (side A decode vs side B verify)")
    assert "drafted tokens carry no logprobs (placeholders on side B)" in reason and "--calibrate 8" in reason
    assert all(decide(ev, noise)[0] == "identical" for ev in evs[1:])


def test_the_recomputed_verify_noise_judges_the_divergence_both_ways() -> None:
    """With the verify path measured (recomputed prefixes: A's decode margin against B's row of a
    multi-token forward), a margin within that noise is numerical and one beyond it suspect;
    either reason names the pair and how many tokens its noise rests on."""
    evs = llama_case()
    for ev in evs[1:9]:  # 8 prompts x 4 positions recomputed
        for change in (0.01, 0.02, 0.08, 0.03):
            paths.add(ev.recomputed, "decode/verify", change)
    verdict, reason = decide(evs[0], estimate_noise(evs))
    assert (verdict, reason) == (
        "numerical",
        "reference margin 0.05 within the noise 0.08 of side A decode vs side B verify (recomputed, 32 tokens)",
    )
    for ev in evs[1:9]:
        ev.recomputed = {"decode/verify": (4, 0.01)}
    assert decide(evs[0], estimate_noise(evs))[0] == "suspect"


def test_never_a_verdict_on_too_few_tokens_and_no_noise_lent_by_another_pair() -> None:
    """Seven recomputed tokens are not a measurement (eight are needed, from two prompts or more);
    a pair measured on many tokens with a large noise (prompt/prompt 0.5 here) lends none of it."""
    evs = llama_case()
    for ev in evs[1:]:
        ev.pairs = {"prompt/prompt": (1, 0.5)}
    evs[1].recomputed = {"decode/verify": (7, 0.08)}
    verdict, reason = decide(evs[0], estimate_noise(evs))
    assert verdict == "unattributed"
    assert "measured on 7 tokens of 1 prompts (at least 8 tokens of 2 prompts needed)" in reason
    evs[1].recomputed = {"decode/verify": (8, 0.08)}  # eight, but from one prompt
    assert decide(evs[0], estimate_noise(evs))[0] == "unattributed"


def test_a_prompt_stands_out_only_on_several_measured_tokens() -> None:
    """One measured token a prompt (a drafting server's first token) moved 1000x the others: a
    padded row, or a bug, one token cannot tell. Four such tokens make it stand out."""
    evs = [Evidence(i, 20, 20, "token", prefix_tokens=1, prefix_median=1e-5, prefix_max=1e-5) for i in range(8)]
    evs.append(Evidence(8, 20, 20, "token", prefix_tokens=1, prefix_median=1e-2, prefix_max=1e-2))
    assert estimate_noise(evs).outliers == frozenset()
    evs[-1].prefix_tokens = 4
    assert estimate_noise(evs).outliers == frozenset({(8, 0)})


class _Server:
    """A server stand-in answering a recomputed prefix: the shared token on top, by `margin`."""

    def __init__(self, margin: float, cached: bool = False, prompt_tokens: int | None = None) -> None:
        self.margin, self.cached, self.prompt_tokens, self.asked = margin, cached, prompt_tokens, []

    def complete(self, prompt: Prompt, max_tokens: int | None = None, fresh: bool = False) -> Answer:
        self.asked.append((prompt.as_text(), max_tokens, fresh))
        word = WORDS[prompt.as_text().count(" w")]  # the token at the position sent
        top = ((word, -0.1), (" x", -0.1 - self.margin))
        return Answer(word, (Token(word, None, -0.1, top),), cached=self.cached, prompt_tokens=self.prompt_tokens)


class _Pool:
    def map(self, fn, items):
        return [fn(x) for x in items]


def test_recompute_measures_each_pair_and_drops_what_measures_another_path() -> None:
    """Positions of the shared prefix where a side verified; A's decode margin (1.0) against B's
    recomputed one (0.7): decode/verify 0.3 per copy; A's recomputed (0.9) against B's: verify/verify
    0.2 (and prompt/prompt, literally two prompt-forward rows). Sent with cache_prompt off, for one
    token, the prompt plus the shared text. A cached answer, or a prompt tokenized otherwise, is
    not a measurement."""
    a, b = plain(WORDS, [1.0] * 24), llama_drafted(WORDS, 1.0)
    ev = compare(0, a, b)
    # candidates: positions 1..23 (B verified each); 4 of 23, a step of 5.75: indices 0, 5, 11, 17
    assert recompute.positions(ev, a, b, 4) == [1, 6, 12, 18]
    side_a, side_b = _Server(0.9), _Server(0.7)
    used = recompute.measure([(ev, a, b, Prompt(text="Q:"))], side_a, side_b, _Pool(), 2, 4, 8)
    assert used == 1 and side_a.asked[0] == ("Q:" + WORDS[0], 1, True) and len(side_b.asked) == 8
    assert ev.recomputed["decode/verify"] == (8, pytest.approx(0.3))
    assert ev.recomputed["verify/verify"] == (8, pytest.approx(0.2))
    assert ev.recomputed["prompt/prompt"] == (8, pytest.approx(0.2))
    for stale in (_Server(0.7, cached=True), _Server(0.7, prompt_tokens=99)):
        ev2 = compare(0, a, b)
        a_counted = Answer(a.text, a.tokens, prompt_tokens=3)
        recompute.measure([(ev2, a_counted, b, Prompt(text="Q:"))], _Server(0.9, cached=True), stale, _Pool(), 2, 4, 8)
        assert ev2.recomputed == {}


def test_a_server_refusing_cache_prompt_is_asked_without_it_once() -> None:
    """`fresh` sends `cache_prompt: false` (llama.cpp); a server validating its fields strictly
    answers 400 to it: the client asks again without the field, and from then on never sends it.
    The answer's `usage.prompt_tokens` is read (the recomputation's tokenization check)."""
    bodies: list[dict] = []

    class Strict(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            ok = "cache_prompt" not in body
            reply = {"choices": [{"text": " a", "finish_reason": "length"}], "usage": {"prompt_tokens": 7}}
            payload = json.dumps(reply if ok else {"error": {"message": "unexpected field"}}).encode()
            self.send_response(200 if ok else 400)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Strict)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        end = Endpoint.parse(f"http://127.0.0.1:{server.server_address[1]}/v1")
        client = Client(end, "completions", "m", 4, 0, None, InFlightClock(), timeout_s=5, retries=0)
        for _ in range(2):
            assert client.complete(Prompt(text="Q:"), max_tokens=1, fresh=True).prompt_tokens == 7
        client.close()
    finally:
        server.shutdown()
        server.server_close()
    assert ["cache_prompt" in b for b in bodies] == [True, False, False] and client.cache_flag_refused
