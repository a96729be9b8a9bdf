"""What one probe run is asked to do (`ProbeConfig`, the `specviz probe` flags), checked before
anything is sent."""

from __future__ import annotations

from dataclasses import dataclass

MAX_LEVELS = 16
MAX_ROUNDS = 1000
MAX_CALIBRATE = 64


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
    calibrate: int = 4  # --calibrate: shared positions recomputed per prompt where a verify path shows (recompute.py)

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
        if not 0 <= self.calibrate <= MAX_CALIBRATE:
            raise ValueError(f"--calibrate must be between 0 and {MAX_CALIBRATE}")
        if self.metrics not in ("auto", "on", "off"):
            raise ValueError("--metrics must be auto, on or off")
