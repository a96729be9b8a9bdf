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
After the last chunk: per level, the noise and every comparison's verdict; acceptance per level
against level 1 (a collapse is a finding of its own); the report, with what to do next.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from specviz.probe import attribution, telemetry
from specviz.probe import report as rp
from specviz.probe.advice import next_steps
from specviz.probe.client import Client, Endpoint, InFlightClock, redact
from specviz.probe.compare import Evidence, compare, rescore
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer

Progress = Callable[[int, int], None]  # (requests done, requests in all)
MAX_COMPARISONS = 2_000_000  # prompts x rounds x levels: each keeps an Evidence (~1 KB)
MAX_LEVELS = 16
MAX_ROUNDS = 1000
BATCH_PROMPTS = 6  # prompts sent as a batch of copies of themselves (the batch calibration)


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
    chunk: int | None = None  # prompts per chunk (default max(64, 8 x the largest level))
    levels: tuple[int, ...] | None = None  # --concurrency 1,2,4,...: a sweep against level 1
    rounds: int = 1  # --rounds: the whole workload again, for rare corruption
    metrics: str = "auto"  # read <root>/metrics around each pass: auto | on | off

    @property
    def sweep(self) -> tuple[int, ...]:
        return self.levels or (self.concurrency,)

    def validate(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError("--endpoint must be completions or chat")
        for name in ("max_tokens", "concurrency", "repeats", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.rounds > MAX_ROUNDS:
            raise ValueError(f"--rounds must be at most {MAX_ROUNDS}")
        if self.levels is not None:
            if not self.levels or min(self.levels) < 1 or len(set(self.levels)) != len(self.levels):
                raise ValueError("--concurrency: a list of distinct levels of at least 1, e.g. 1,2,4,8,16")
            if len(self.levels) > MAX_LEVELS:
                raise ValueError(f"--concurrency: at most {MAX_LEVELS} levels")
            if self.url_b is not None and len(self.levels) > 1:
                raise ValueError("--concurrency with several levels sweeps one server: give one URL")
        if not 0 <= self.logprobs <= 20:
            raise ValueError("--logprobs must be between 0 and 20")
        if self.timeout_s <= 0 or self.retries < 0:
            raise ValueError("--timeout must be positive and --retries at least 0")
        if self.metrics not in ("auto", "on", "off"):
            raise ValueError("--metrics must be auto, on or off")


@dataclass
class _Tally:
    """What one side or level's passes reported about drafting, and how many placeholders."""

    drafting: list[telemetry.Drafting] = field(default_factory=list)
    adapter: str | None = None
    error: str | None = None
    scraped: telemetry.Drafting | None = None  # summed /metrics deltas
    scrape_error: str | None = None
    tokens: int = 0
    placeholders: int = 0

    def add(self, answers: list[Answer]) -> None:
        for a in answers:
            self.tokens += len(a.tokens or ())
            self.placeholders += a.placeholders
            if a.telemetry_error and self.error is None:
                self.error = a.telemetry_error
            if a.drafting is not None:
                self.adapter = self.adapter or a.telemetry
                self.drafting.append(a.drafting)

    def add_scrape(self, delta: telemetry.Drafting) -> None:
        s = self.scraped
        if s is None:
            self.scraped = delta
            return
        self.scraped = telemetry.Drafting(
            (s.drafted or 0) + (delta.drafted or 0), (s.accepted or 0) + (delta.accepted or 0),
            None, None, (s.drafts or 0) + (delta.drafts or 0) or None,
        )  # fmt: skip

    def acceptance(self) -> tuple[rp.Acceptance | None, telemetry.Rate | None]:
        """What the report shows, and the rate a collapse is judged on: None where the source it
        came from had unbelievable values (they decide nothing)."""
        rate = telemetry.per_request_rate(self.drafting) if self.drafting else None
        source, error = self.adapter or "response", self.error
        if rate is None and self.scraped is not None and self.scraped.drafted and self.scrape_error is None:
            rate, source, error = telemetry.aggregate_rate(self.scraped), "prometheus", None
        problems = "; ".join(e for e in (self.error, self.scrape_error) if e) or None
        if rate is None:
            if problems is None:
                return None, None
            return rp.Acceptance(source, 0, 0, 0, None, None, None, None, problems), None
        shown = rp.Acceptance(
            source, rate.requests, rate.drafted, rate.accepted, rate.rate, rate.low, rate.high, rate.mean_length,
            problems,
        )  # fmt: skip
        return shown, (rate if error is None else None)


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

    def around(self, run: Callable[[], list[Answer]], tally: _Tally) -> list[Answer]:
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
    tally_a = _Tally()
    tallies = {n: _Tally() for n in levels}
    chunk = config.chunk or max(64, 8 * max(levels))
    pool_a = ThreadPoolExecutor(config.concurrency if two else 1, thread_name_prefix="probe-a")
    pools = {n: ThreadPoolExecutor(n, thread_name_prefix=f"probe-{n}") for n in levels}

    def send(pool: ThreadPoolExecutor, side: Client, batch: list[Prompt], tally: _Tally) -> list[Answer]:
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
                        same = send(pools[top], side_b, [batch[k - start]] * top, _Tally())
                        batch_evidence.extend(compare(k, answers_a[k - start], b) for b in same)
                else:  # the server against itself, a round apart
                    calibration.extend(compare(start + k, x, y) for k, (x, y) in enumerate(zip(first_a, answers_a)))
                if extra_a:
                    again = send(pool_a, side_a, batch, _Tally())
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
    run = _Run(config, (side_a, side_b), prompts, evidence, calibration, nondet, tally_a, tallies, batch_evidence)
    return run.report(clock, (wall, cpu, replay_s))


def _rescore(pool: ThreadPoolExecutor, side: Client, batch: list[Prompt], start: int, items: list[Evidence]) -> None:
    """Divergences whose tokens are placeholders: the prompt plus the shared prefix sent again,
    alone, for one token; its logprobs give the gap on A (compare.rescore). On the completions
    endpoint only (a chat answer cannot be continued portably)."""

    def one(ev: Evidence) -> Answer:
        prompt = batch[ev.index - start]
        return side.complete(Prompt(text=prompt.as_text() + (ev.prefix_text or "")), max_tokens=1)

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


def wilson_interval(k: int, n: int) -> tuple[float, float]:
    return telemetry.wilson(k, n)


@dataclass
class _Run:
    """4) After the last chunk: noise per level, verdicts, acceptance, the report."""

    config: ProbeConfig
    sides: tuple[Client, Client]
    prompts: list[Prompt]
    evidence: dict[int, list[Evidence]]
    calibration_evidence: list[Evidence]
    nondet: dict[int, dict[int, int]]
    tally_a: _Tally
    tallies: dict[int, _Tally]
    batch_evidence: list[Evidence]

    def report(self, clock: InFlightClock, times: tuple[float, float, float]) -> rp.ProbeReport:
        config, (side_a, side_b) = self.config, self.sides
        wall, cpu, replay_s = times
        two = config.url_b is not None
        calib = attribution.calibrate(self.calibration_evidence, self._calibration_source())
        batch = attribution.batch_cuts(self.batch_evidence)
        acceptance_a, rate_a = self.tally_a.acceptance()
        levels, decided, noises = [], {}, {}
        for n, evs in self.evidence.items():
            alone = n == 1 and not two
            noise = attribution.estimate_noise(evs, None if alone else calib, None if alone else batch)
            noises[n] = noise
            decided[n] = [(ev, *attribution.decide(ev, noise)) for ev in evs]
            acceptance, rate = self.tallies[n].acceptance()
            collapse = n > 1 and not two and telemetry.collapsed(rate_a, rate)
            levels.append(self._level(n, decided[n], noise, acceptance, collapse))
        primary = max(levels, key=lambda v: (rp.VERDICTS.index(v.verdict), v.rate, v.concurrency)).concurrency
        results = self._per_prompt(decided[primary], noises[primary], primary)
        counts = {v: sum(r.verdict == v for r in results) for v in rp.VERDICTS}
        collapse = self._collapse(levels, acceptance_a)
        overhead = max(0.0, wall - clock.busy_s)
        noise = noises[primary]
        sources = {ev.source for ev in self.evidence[primary] if ev.prefix_median is not None or ev.swing is not None}
        ends = side_a.endpoint, side_b.endpoint
        tally_b = self.tallies[primary]
        acceptance_b = next(v.acceptance for v in levels if v.concurrency == primary)
        report = rp.ProbeReport(
            format=rp.FORMAT,
            version=rp.VERSION,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            verdict=attribution.run_verdict(v.verdict for v in levels),
            mode="ab" if two else "batch",
            endpoint=config.endpoint,
            max_tokens=config.max_tokens,
            logprobs=config.logprobs,
            repeats=config.repeats,
            replay=config.replay,
            side_a=rp.Side(
                "server A" if two else "alone",
                redact(ends[0].url),
                side_a.model,
                config.concurrency if two else 1,
                self.tally_a.tokens,
                self.tally_a.placeholders,
                acceptance_a,
            ),  # fmt: skip
            side_b=rp.Side(
                "server B" if two else "concurrent",
                redact(ends[1].url),
                side_b.model,
                primary,
                tally_b.tokens,
                tally_b.placeholders,
                acceptance_b,
            ),  # fmt: skip
            counts=counts,
            nondeterministic=len(self.nondet[primary]),
            noise=_noise_view(noise, "replay" if "replay" in sources else "server" if "server" in sources else "none"),
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
            rounds=config.rounds,
            levels=tuple(levels) if config.levels else (),
            collapse=collapse,
        )
        return dataclasses.replace(report, next_steps=next_steps(report))

    def _calibration_source(self) -> str:
        c = self.config
        if 1 in c.sweep and c.url_b is None:
            return "side A sent again (level 1 of the sweep)"
        if c.rounds > 1:
            return f"side A in rounds 2-{c.rounds} against round 1"
        return "side A sent again (--repeats)"

    def _level(self, n: int, decided: list, noise: attribution.Noise, acceptance, collapse: bool) -> rp.Level:
        comparisons = len(decided)
        diverged = sum(ev.divergence is not None for ev, _, _ in decided)
        low, high = wilson_interval(diverged, comparisons)
        counts = {v: sum(verdict == v for _, verdict, _ in decided) for v in rp.VERDICTS}
        tally = self.tallies[n]
        return rp.Level(
            n, comparisons, diverged, diverged / comparisons if comparisons else 0.0, low, high, counts,
            attribution.run_verdict(verdict for _, verdict, _ in decided), noise.estimate,
            tally.placeholders, tally.tokens, acceptance, collapse,
        )  # fmt: skip

    def _per_prompt(self, decided: list, noise: attribution.Noise, level: int) -> list[rp.PromptResult]:
        """One result per prompt: its worst comparison over the rounds (the first such round)."""
        by_prompt: dict[int, list] = {}
        for item in decided:
            by_prompt.setdefault(item[0].index, []).append(item)
        out = []
        for index in sorted(by_prompt):
            items = by_prompt[index]
            ev, verdict, reason = max(items, key=lambda x: (rp.VERDICTS.index(x[1]), -x[0].round))
            diverged = sum(e.divergence is not None for e, _, _ in items)
            out.append(
                _result(
                    ev,
                    verdict,
                    reason,
                    self.prompts[index],
                    noise,
                    self.nondet[level].get(index),
                    level,
                    len(items),
                    diverged,
                )  # fmt: skip
            )
        return out

    def _collapse(self, levels: list[rp.Level], acceptance_a: rp.Acceptance | None) -> rp.Collapse | None:
        first = next((v for v in sorted(levels, key=lambda v: v.concurrency) if v.collapse), None)
        if first is None or acceptance_a is None or first.acceptance is None:
            return None
        held = [v.concurrency for v in levels if 1 < v.concurrency < first.concurrency and not v.collapse]
        a, b = acceptance_a, first.acceptance
        if a.rate is not None and b.rate is not None:
            r1, r, what = a.rate, b.rate, "acceptance"
            shown = f"{r1:.2f} [{a.low:.2f}, {a.high:.2f}] at concurrency 1, {r:.2f} [{b.low:.2f}, {b.high:.2f}]"
        else:  # only the mean acceptance length is reported
            r1, r, what = a.mean_length or 0.0, b.mean_length or 0.0, "mean acceptance length"
            shown = f"{r1:.2f} at concurrency 1, {r:.2f}"
        detail = (
            f"{what} {shown} at concurrency {first.concurrency}"
            + (f" (held at {', '.join(map(str, held))})" if held else "")
            + ": a batching bug in drafting"
        )
        return rp.Collapse(first.concurrency, r1, r, detail)


def _noise_view(noise: attribution.Noise, source: str) -> rp.Noise:
    paths = tuple(
        rp.PathNoise(p.path, p.prompts, p.estimate, p.typical, p.baseline, p.cut, p.cut_max, p.pooled)
        for p in noise.paths
    )
    c = noise.calibration
    calibration = rp.Calibration(c.source, c.prompts, c.typical, c.largest) if c else None
    batch = (10 ** noise.batch[0], 10 ** noise.batch[1]) if noise.batch else (None, None)
    return rp.Noise(
        noise.estimate, noise.typical, noise.baseline, noise.cut, noise.prompts, source, noise.cut_max, paths,
        calibration, *batch,
    )  # fmt: skip


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def _result(
    ev: Evidence, verdict: str, reason: str, prompt: Prompt, noise: attribution.Noise, nondet: int | None,
    level: int, rounds: int, diverged: int,
) -> rp.PromptResult:  # fmt: skip
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
        gap_a=_finite(ev.gap_a),
        gap_b=_finite(ev.gap_b),
        swing=_finite(ev.swing),
        top_margin_a=ev.top_margin_a,
        lower_bound=ev.lower_bound,
        stands_out=(ev.index, ev.round) in noise.outliers,
        evidence=ev.source,
        nondeterministic_at=nondet,
        placeholders_a=ev.placeholders_a,
        placeholders_b=ev.placeholders_b,
        path=ev.path,
        concurrency=level,
        round=ev.round,
        rounds=rounds,
        diverged_rounds=diverged,
        findings=tuple(rp.Finding(k, d) for k, d in ev.findings),
    )
