"""One probe run: send the prompts to both sides, chunk by chunk, compare, attribute, report.

Chunks keep memory bounded: a chunk's answers are compared (and replayed) as soon as every pass
returned them, then dropped; only each comparison's Evidence (a few numbers) stays for the noise
estimate, which needs every prompt.

Per chunk, per round (--rounds):
    1) side A: the chunk alone (concurrency 1), or on server A at --concurrency
    2) per concurrency level (--concurrency 1,2,4,...: a sweep; one level otherwise): the chunk
       at that level, --repeats times (repeat 0 is compared with A). Level 1 is side A sent
       again: the server against itself, which is also the noise calibration
    3) compare each prompt; --replay rescored where the server gave no logprobs
Around every pass: the drafting the server reported (per answer, or /metrics deltas).
After the last chunk (`outcome.Outcome`): per level, the noise and every comparison's verdict;
acceptance per level against level 1 (a collapse is a finding of its own); the report, with what
to do next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from specviz.probe import recompute, telemetry
from specviz.probe.client import Client, Endpoint, InFlightClock
from specviz.probe.compare import Evidence, compare, rescore
from specviz.probe.config import ProbeConfig
from specviz.probe.outcome import Outcome, Tally
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer

Progress = Callable[[int, int], None]  # (requests done, requests in all)
MAX_COMPARISONS = 2_000_000  # prompts x rounds x levels: each keeps an Evidence (~1 KB)
BATCH_PROMPTS = 6  # prompts sent as a batch of copies of themselves (the batch calibration)


class _Metrics:
    """/metrics around each pass (vLLM's spec-decode counters), when the server has them."""

    def __init__(self, client: Client, mode: str) -> None:
        self.client, self.enabled, self.error = client, mode != "off", None
        if self.enabled:
            first = self._read()
            self.enabled = first is not None and telemetry.PROMETHEUS_COUNTERS["drafted"] in first
            if not self.enabled and mode == "on" and self.error is None:
                self.error = "/metrics: no vllm:spec_decode counters"

    def _read(self) -> dict[str, float] | None:
        text = self.client.scrape_metrics()
        if text is None:
            return None
        try:
            return telemetry.parse_prometheus(text)
        except telemetry.TelemetryError as exc:
            self.error = str(exc)
            return None

    def around(self, run: Callable[[], list[Answer]], tally: Tally) -> list[Answer]:
        if not self.enabled:
            return run()
        before = self._read()
        answers = run()
        after = self._read()
        if before is not None and after is not None:
            try:
                delta = telemetry.prometheus_delta(before, after)
            except telemetry.TelemetryError as exc:
                tally.scrape_error = tally.scrape_error or str(exc)
            else:
                if delta is not None:
                    tally.add_scrape(delta)
        return answers


def run_probe(config: ProbeConfig, prompts: list[Prompt], api_key: str | None, progress: Progress | None = None):
    config.validate()
    levels = config.sweep
    if len(prompts) * config.rounds * len(levels) > MAX_COMPARISONS:
        raise ValueError(f"prompts x --rounds x levels is over {MAX_COMPARISONS:,}: fewer prompts or rounds")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    clock = InFlightClock()
    two = config.url_b is not None
    side_a, side_b = _open_sides(config, api_key, clock)
    metrics_a = _Metrics(side_a, config.metrics)
    metrics_b = metrics_a if not two else _Metrics(side_b, config.metrics)
    replayer, replay_s = _replayer(config)

    # an extra alone pass calibrates the noise when nothing else sends side A again
    extra_a = not two and 1 not in levels and config.rounds == 1 and config.repeats >= 2
    passes = 1 + sum(1 if (n == 1 and not two) else config.repeats for n in levels) + extra_a
    top = max(levels)
    copies = [] if two or top == 1 else list(range(min(BATCH_PROMPTS, len(prompts))))
    total = len(prompts) * config.rounds * passes + len(copies) * top
    batch_evidence: list[Evidence] = []
    done = 0
    evidence: dict[int, list[Evidence]] = {n: [] for n in levels}
    calibration: list[Evidence] = []
    nondet: dict[int, dict[int, int]] = {n: {} for n in levels}
    tally_a = Tally()
    tallies = {n: Tally() for n in levels}
    chunk = config.chunk or max(64, 8 * max(levels))
    pool_a = ThreadPoolExecutor(config.concurrency if two else 1, thread_name_prefix="probe-a")
    pools = {n: ThreadPoolExecutor(n, thread_name_prefix=f"probe-{n}") for n in levels}
    recomputable = config.endpoint == "completions" and config.logprobs > 0 and config.calibrate > 0 and not replayer
    recompute_budget = {n: recompute.MAX_PROMPTS for n in levels}

    def send(pool: ThreadPoolExecutor, side: Client, batch: list[Prompt], tally: Tally) -> list[Answer]:
        def run() -> list[Answer]:
            nonlocal done
            answers = []
            for answer in pool.map(side.complete, batch):  # in order; the pool keeps N in flight
                answers.append(answer)
                done += 1
                if progress:
                    progress(done, total)
            return answers

        answers = (metrics_a if side is side_a else metrics_b).around(run, tally)
        tally.add(answers)
        return answers

    try:
        for start in range(0, len(prompts), chunk):
            batch = prompts[start : start + chunk]
            texts = [p.as_text() for p in batch]
            first_a: list[Answer] = []
            for rnd in range(config.rounds):
                answers_a = send(pool_a, side_a, batch, tally_a)  # 1) side A
                if rnd == 0:
                    first_a = answers_a
                    for k in (k for k in copies if start <= k < start + len(batch)):  # the batch calibration
                        same = send(pools[top], side_b, [batch[k - start]] * top, Tally())
                        batch_evidence.extend(compare(k, answers_a[k - start], b) for b in same)
                else:  # the server against itself, a round apart
                    calibration.extend(compare(start + k, x, y) for k, (x, y) in enumerate(zip(first_a, answers_a)))
                if extra_a:
                    again = send(pool_a, side_a, batch, Tally())
                    calibration.extend(compare(start + k, x, y) for k, (x, y) in enumerate(zip(answers_a, again)))
                for level in levels:  # 2)
                    if level == 1 and not two:  # side A again: level 1 of the sweep, and the calibration
                        repeats = [send(pool_a, side_a, batch, tallies[1])]
                    else:
                        repeats = [send(pools[level], side_b, batch, tallies[level]) for _ in range(config.repeats)]
                    found = []
                    rescorable = config.endpoint == "completions" and config.logprobs > 0 and replayer is None
                    for k, (a, b) in enumerate(zip(answers_a, repeats[0])):  # 3)
                        ev = compare(start + k, a, b, prompt=texts[k], rescorable=rescorable)
                        ev.round = rnd
                        found.append(ev)
                        for again in repeats[1:]:
                            d = compare(start + k, b, again[k]).divergence
                            if d is not None:
                                nondet[level][start + k] = min(d, nondet[level].get(start + k, d))
                    rescue = [ev for ev in found if ev.prefix_text is not None]
                    if rescue:
                        _rescore(pool_a, side_a, batch, start, rescue)
                    if recomputable and rnd == 0 and not (level == 1 and not two):  # the verify path's noise
                        items = list(zip(found, answers_a, repeats[0], batch))
                        copies = min(level, recompute.COPIES)
                        recompute_budget[level] -= recompute.measure(
                            items, side_a, side_b, pools[level], copies, config.calibrate, recompute_budget[level]
                        )
                    if level == 1 and not two:
                        calibration.extend(found)
                    evidence[level].extend(found)
                    if replayer is not None:
                        t = time.perf_counter()
                        todo = [
                            (prompt, a, b, ev)
                            for prompt, a, b, ev in zip(batch, answers_a, repeats[0], found)
                            if ev.source == "none" or not (a.has_logprobs and b.has_logprobs)
                        ]
                        replayer.fill(todo, level)
                        replay_s += time.perf_counter() - t
                    del repeats
                del answers_a
    finally:
        pool_a.shutdown(cancel_futures=True)
        for pool in pools.values():
            pool.shutdown(cancel_futures=True)
        side_a.close()
        side_b.close()

    wall = time.perf_counter() - wall0 - replay_s  # the local model's time is not the probe's overhead
    cpu = time.process_time() - cpu0 - replay_s
    for tally, m in ((tally_a, metrics_a), *((t, metrics_b) for t in tallies.values())):
        tally.scrape_error = tally.scrape_error or m.error
    run = Outcome(config, (side_a, side_b), prompts, evidence, calibration, nondet, tally_a, tallies, batch_evidence)
    return run.report(clock, (wall, cpu, replay_s))


def _rescore(pool: ThreadPoolExecutor, side: Client, batch: list[Prompt], start: int, items: list[Evidence]) -> None:
    """Divergences whose tokens are placeholders: the prompt plus the shared prefix sent again,
    alone, for one token; its logprobs give the gap on A (compare.rescore). On the completions
    endpoint only (a chat answer cannot be continued portably)."""

    def one(ev: Evidence) -> Answer:
        prompt = batch[ev.index - start]
        # fresh: the whole prompt computed (a prompt forward, as recompute.py measures it), not
        # its last token alone over a cached prefix
        return side.complete(Prompt(text=prompt.as_text() + (ev.prefix_text or "")), max_tokens=1, fresh=True)

    for ev, answer in zip(items, pool.map(one, items)):
        if answer.tokens:
            rescore(ev, answer.tokens[0])
        ev.prefix_text = None


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
