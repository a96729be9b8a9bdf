"""One probe run: send the prompts to both sides, chunk by chunk, compare, attribute, report.

Chunks keep memory bounded: a chunk's answers are compared (and replayed) as soon as both sides
returned them, then dropped; only each prompt's Evidence (a few numbers) stays for the noise
estimate, which needs every prompt.

    1) side A: the chunk alone (concurrency 1), or on server A at --concurrency
    2) side B: the chunk at --concurrency, --repeats times (repeat 0 is compared with A)
    3) compare each prompt; --replay rescored where the server gave no logprobs
    4) after the last chunk: estimate the noise, decide every prompt, build the report
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from specviz.probe import attribution
from specviz.probe import report as rp
from specviz.probe.client import Client, Endpoint, InFlightClock, redact
from specviz.probe.compare import Evidence, compare
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer

Progress = Callable[[int, int], None]  # (requests done, requests in all)


@dataclass
class ProbeConfig:
    url_a: str
    url_b: str | None = None
    endpoint: str = "completions"
    model: str | None = None
    max_tokens: int = 64
    concurrency: int = 8
    repeats: int = 1
    logprobs: int = 5
    replay: str | None = None
    replay_dtype: str = "float32"
    timeout_s: float = 120.0
    retries: int = 2
    chunk: int | None = None  # prompts per chunk (default max(64, 8 x concurrency))

    def validate(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError("--endpoint must be completions or chat")
        for name in ("max_tokens", "concurrency", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if not 0 <= self.logprobs <= 20:
            raise ValueError("--logprobs must be between 0 and 20")
        if self.timeout_s <= 0 or self.retries < 0:
            raise ValueError("--timeout must be positive and --retries at least 0")


def run_probe(config: ProbeConfig, prompts: list[Prompt], api_key: str | None, progress: Progress | None = None):
    config.validate()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    clock = InFlightClock()
    two = config.url_b is not None
    side_a, side_b = _open_sides(config, api_key, clock)

    replayer, replay_s = _replayer(config)

    total = len(prompts) * (1 + config.repeats)
    done = 0
    evidence: list[Evidence] = []
    nondet: dict[int, int] = {}
    chunk = config.chunk or max(64, 8 * config.concurrency)
    pool_a = ThreadPoolExecutor(config.concurrency if two else 1, thread_name_prefix="probe-a")
    pool_b = ThreadPoolExecutor(config.concurrency, thread_name_prefix="probe-b")

    def send(pool: ThreadPoolExecutor, side: Client, batch: list[Prompt]) -> list[Answer]:
        nonlocal done
        answers = []
        for answer in pool.map(side.complete, batch):  # in order; the pool keeps N in flight
            answers.append(answer)
            done += 1
            if progress:
                progress(done, total)
        return answers

    try:
        for start in range(0, len(prompts), chunk):
            batch = prompts[start : start + chunk]
            answers_a = send(pool_a, side_a, batch)  # 1) side A
            repeats = [send(pool_b, side_b, batch) for _ in range(config.repeats)]  # 2) side B
            for offset, (a, b) in enumerate(zip(answers_a, repeats[0])):  # 3)
                index = start + offset
                evidence.append(compare(index, a, b))
                for again in repeats[1:]:
                    d = compare(index, b, again[offset]).divergence
                    if d is not None:
                        nondet[index] = min(d, nondet.get(index, d))
            if replayer is not None:
                t = time.perf_counter()
                todo = [
                    (prompt, a, b, evidence[start + k])
                    for k, (prompt, a, b) in enumerate(zip(batch, answers_a, repeats[0]))
                    if evidence[start + k].source == "none" or not (a.has_logprobs and b.has_logprobs)
                ]
                replayer.fill(todo, config.concurrency)
                replay_s += time.perf_counter() - t
            del answers_a, repeats
    finally:
        pool_a.shutdown(cancel_futures=True)
        pool_b.shutdown(cancel_futures=True)
        side_a.close()
        side_b.close()

    wall = time.perf_counter() - wall0 - replay_s  # the local model's time is not the probe's overhead
    cpu = time.process_time() - cpu0 - replay_s
    return _report(config, (side_a, side_b), prompts, evidence, nondet, clock, (wall, cpu, replay_s))


def _replayer(config: ProbeConfig) -> tuple[Any, float]:
    """The local model for `--replay` (None without it), and the seconds loading it took."""
    if not config.replay:
        return None, 0.0
    started = time.perf_counter()
    from specviz.probe.replay import Replayer

    return Replayer(config.replay, config.replay_dtype, config.endpoint), time.perf_counter() - started


def _open_sides(config: ProbeConfig, api_key: str | None, clock: InFlightClock) -> tuple[Client, Client]:
    """The two sides' clients (one server twice in batch mode), each model named or discovered:
    discovery is also the reachability check, before any prompt is sent."""
    ends = Endpoint.parse(config.url_a), Endpoint.parse(config.url_b or config.url_a)

    def client(end: Endpoint) -> Client:
        return Client(
            end, config.endpoint, config.model, config.max_tokens, config.logprobs, api_key, clock,
            config.timeout_s, config.retries,
        )  # fmt: skip

    side_a, side_b = client(ends[0]), client(ends[1])
    two = config.url_b is not None
    for side in (side_a, side_b) if two else (side_a,):
        if side.model is None:
            side.model = side.discover_model()
    if not two:
        side_b.model = side_a.model
    return side_a, side_b


def _report(
    config: ProbeConfig,
    sides: tuple[Client, Client],
    prompts: list[Prompt],
    evidence: list[Evidence],
    nondet: dict[int, int],
    clock: InFlightClock,
    times: tuple[float, float, float],
) -> rp.ProbeReport:
    """4) The noise from every prompt's shared prefix, each prompt's verdict, the report."""
    side_a, side_b = sides
    wall, cpu, replay_s = times
    two = config.url_b is not None
    ends = side_a.endpoint, side_b.endpoint
    noise = attribution.estimate_noise(evidence)
    results = [_result(ev, prompts[ev.index], noise, nondet.get(ev.index)) for ev in evidence]
    counts = {v: sum(r.verdict == v for r in results) for v in rp.VERDICTS}
    overhead = max(0.0, wall - clock.busy_s)
    sources = {ev.source for ev in evidence if ev.prefix_median is not None or ev.swing is not None}
    return rp.ProbeReport(
        format=rp.FORMAT,
        version=rp.VERSION,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        verdict=attribution.run_verdict(r.verdict for r in results),
        mode="ab" if two else "batch",
        endpoint=config.endpoint,
        max_tokens=config.max_tokens,
        logprobs=config.logprobs,
        repeats=config.repeats,
        replay=config.replay,
        side_a=rp.Side(
            "server A" if two else "alone", redact(ends[0].url), side_a.model, config.concurrency if two else 1
        ),
        side_b=rp.Side("server B" if two else "concurrent", redact(ends[1].url), side_b.model, config.concurrency),
        counts=counts,
        nondeterministic=len(nondet),
        noise=rp.Noise(
            noise.estimate,
            noise.typical,
            noise.baseline,
            noise.cut,
            noise.prompts,
            "replay" if "replay" in sources else "server" if "server" in sources else "none",
        ),  # fmt: skip
        timing=rp.Timing(
            wall_s=wall,
            server_busy_s=clock.busy_s,
            overhead_s=overhead,
            overhead_fraction=overhead / wall if wall > 0 else 0.0,
            client_cpu_s=max(0.0, cpu),
            replay_s=replay_s,
            requests=clock.requests,
        ),
        prompts=tuple(results),
    )


def _result(ev: Evidence, prompt: Prompt, noise: attribution.Noise, nondet: int | None) -> rp.PromptResult:
    verdict, reason = attribution.decide(ev, noise)

    def view(shown) -> rp.TokenView | None:
        return None if shown is None else rp.TokenView(shown.text, shown.id, shown.logprob_a, shown.logprob_b)

    return rp.PromptResult(
        index=ev.index,
        prompt=prompt.preview(),
        verdict=verdict,
        reason=reason,
        length_a=ev.length_a,
        length_b=ev.length_b,
        unit=ev.unit,
        divergence=ev.divergence,
        token_a=view(ev.token_a),
        token_b=view(ev.token_b),
        context=ev.context,
        prefix_tokens=ev.prefix_tokens,
        prefix_median=ev.prefix_median,
        prefix_max=ev.prefix_max,
        gap_a=ev.gap_a,
        gap_b=ev.gap_b,
        swing=ev.swing,
        top_margin_a=ev.top_margin_a,
        lower_bound=ev.lower_bound,
        stands_out=ev.index in noise.outliers,
        evidence=ev.source,
        nondeterministic_at=nondet,
    )
