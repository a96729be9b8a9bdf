"""What one probe run found, as its report: the drafting each side and level reported (`Tally`),
then, after the last chunk, the noise per level, each comparison's verdict, acceptance against
level 1 and the report with what to do next (`Outcome`). `runner` sends; this module decides."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from dataclasses import dataclass, field

from specviz.probe import attribution, positions, telemetry
from specviz.probe import report as rp
from specviz.probe.advice import next_steps
from specviz.probe.client import Client, InFlightClock, redact
from specviz.probe.compare import Evidence
from specviz.probe.config import ProbeConfig
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer


@dataclass
class Tally:
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
        self.scraped = delta if self.scraped is None else telemetry.add(self.scraped, delta)

    def acceptance(self) -> tuple[rp.Acceptance | None, telemetry.Rate | None]:
        """What the report shows, and the rate a collapse is judged on: None where the source it
        came from had unbelievable values (they decide nothing)."""
        rate = telemetry.per_request_rate(self.drafting) if self.drafting else None
        source, error = self.adapter or "response", self.error
        by_position = positions.of(self.drafting)
        if rate is None and self.scraped is not None and self.scraped.drafted and self.scrape_error is None:
            rate, source, error = telemetry.aggregate_rate(self.scraped), "prometheus", None
            by_position = positions.of([self.scraped])
        problems = "; ".join(e for e in (self.error, self.scrape_error) if e) or None
        if rate is None:
            if problems is None:
                return None, None
            return rp.Acceptance(source, 0, 0, 0, None, None, None, None, problems), None
        shown = rp.Acceptance(
            source, rate.requests, rate.drafted, rate.accepted, rate.rate, rate.low, rate.high, rate.mean_length,
            problems, by_position,
        )  # fmt: skip
        return shown, (rate if error is None else None)


@dataclass
class Outcome:
    """After the last chunk: noise per level, verdicts, acceptance, the report."""

    config: ProbeConfig
    sides: tuple[Client, Client]
    prompts: list[Prompt]
    evidence: dict[int, list[Evidence]]
    calibration_evidence: list[Evidence]
    nondet: dict[int, dict[int, int]]
    tally_a: Tally
    tallies: dict[int, Tally]
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
            recomputable = config.endpoint == "completions" and config.logprobs > 0 and config.calibrate > 0
            noise = attribution.estimate_noise(
                evs, None if alone else calib, None if alone else batch, recomputable and not config.replay
            )
            noises[n] = noise
            decided[n] = [(ev, *attribution.decide(ev, noise)) for ev in evs]
            acceptance, rate = self.tallies[n].acceptance()
            collapse = n > 1 and not two and telemetry.collapsed(rate_a, rate)
            collapse = collapse or (n > 1 and not two and positions.collapse(acceptance_a, acceptance) is not None)
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
        low, high = telemetry.wilson(diverged, comparisons)
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
        deep = positions.collapse(a, b)
        if deep is not None and not positions.rate_collapsed(a, b):  # the overall rate held; one position did not
            detail = positions.describe(a, deep, first.concurrency) + ": a batching bug in drafting at that depth"
            return rp.Collapse(first.concurrency, a.positions[deep.position].conditional or 0.0,
                               deep.conditional or 0.0, detail, deep.position)  # fmt: skip
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
            + (
                f"; first at draft position {deep.position} ({positions.describe(a, deep, first.concurrency)})"
                if deep
                else ""
            )
        )
        return rp.Collapse(first.concurrency, r1, r, detail, deep.position if deep else None)


def _noise_view(noise: attribution.Noise, source: str) -> rp.Noise:
    paths = tuple(
        rp.PathNoise(p.path, p.prompts, p.estimate, p.typical, p.baseline, p.cut, p.cut_max, p.pooled)
        for p in noise.paths
    )
    c = noise.calibration
    calibration = rp.Calibration(c.source, c.prompts, c.typical, c.largest) if c else None
    batch = (10 ** noise.batch[0], 10 ** noise.batch[1]) if noise.batch else (None, None)
    pairs = tuple(rp.PairNoise(p.pair, p.tokens, p.prompts, p.estimate, p.source, p.measured) for p in noise.pairs)
    return rp.Noise(
        noise.estimate, noise.typical, noise.baseline, noise.cut, noise.prompts, source, noise.cut_max, paths,
        calibration, *batch, pairs,
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
        divergence_path=ev.pair,
    )
