"""What a bench runs: the arms (ways of decoding), the settings, and the jobs of one repeat.

Nothing here touches a model; a `BenchSettings` plus `jobs_for_batch` is the whole plan of a run.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.engine.faults import FAULTS
from specviz.engine.methods.grouping import POLICIES
from specviz.engine.run import RunConfig
from specviz.errors import SpecvizError
from specviz.proposers import DEFAULT_PROPOSER

EXSPEC_POLICY = "converge"  # the policy of the `exspec` arm; other policies get `exspec-<policy>`
WATCH_ARM = "eqspec-watched"  # EQSPEC under `specviz.watch`; also measures the watch's overhead, paired
GROUPING_BATCH = 8  # the paper's setting for group share: batch 8, window 6 x 8 = 48
CUDA_MIN_REPEATS = 3  # on CUDA the first repeat is an untimed warm-up: at least 2 timed ones remain


@dataclass(frozen=True)
class Arm:
    """One way of decoding: a method plus the knobs the benchmark varies."""

    name: str
    method: str
    per_row_loop: bool = False  # EQSPEC realignment with the reference's per-row Python loop
    policy: str | None = None  # EXSPEC grouping policy
    fault: str | None = None
    watched: bool = False  # run under `specviz.watch` with the engine's recorder off (issue 10's overhead)
    proposer: str = DEFAULT_PROPOSER  # what drafts: a name in the registry (`specviz/proposers.py`)
    tree: int = 0  # tree verification: alternatives at the first `tree` depths (0: a chain)

    def config(self, batch_size: int, draft_k: int, settings: BenchSettings, record_steps: bool = True) -> RunConfig:
        """The engine's run configuration for this arm in one cell."""
        return RunConfig(
            method=self.method,
            fault=self.fault,
            batch_size=batch_size,
            draft_k=max(draft_k, 1),
            max_new_tokens=settings.max_new_tokens,
            seed=settings.seed,
            exspec_window=settings.window_factor * batch_size,
            exspec_policy=self.policy or EXSPEC_POLICY,
            reference=False,  # the oracle is decoded once per prompt set, not once per cell
            record_steps=record_steps and not self.watched,  # watched: the watch writes the trace
            per_row_loop_move=self.per_row_loop,
            proposer=self.proposer if self.method != "baseline" else DEFAULT_PROPOSER,
            tree_branches=min(self.tree, max(draft_k, 1)) if self.method != "baseline" else 0,
        )


ARMS: dict[str, Arm] = {
    "baseline": Arm("baseline", "baseline"),
    "eqspec": Arm("eqspec", "eqspec"),
    "eqspec-loop": Arm("eqspec-loop", "eqspec", per_row_loop=True),
    "exspec": Arm("exspec", "exspec", policy=EXSPEC_POLICY),
    "inplace": Arm("inplace", "inplace"),
    WATCH_ARM: Arm(WATCH_ARM, "eqspec", watched=True),
    **{f"exspec-{p}": Arm(f"exspec-{p}", "exspec", policy=p) for p in POLICIES if p != EXSPEC_POLICY},
}
TREE_BRANCHES = 2  # the `-tree` arms: one alternative at each of the first two depths
DRAFTING = (("", "draft-model", 0), ("-tree", "draft-model", TREE_BRANCHES), ("-head", "head", 0),
            ("-head-tree", "head", TREE_BRANCHES))  # fmt: skip


def _drafting_arms() -> dict[str, Arm]:
    """Chain vs tree, head vs draft model, per method: `METHOD-tree`, `METHOD-head`, `METHOD-head-tree`."""
    arms = {}
    for method in ("eqspec", "exspec", "inplace"):
        policy = EXSPEC_POLICY if method == "exspec" else None
        for suffix, proposer, tree in DRAFTING[1:]:
            arms[method + suffix] = Arm(method + suffix, method, policy=policy, proposer=proposer, tree=tree)
    return arms


ARMS.update(_drafting_arms())
DRAFTING_ARMS = tuple(m + suffix for m in ("eqspec", "exspec", "inplace") for suffix, _, _ in DRAFTING)


def resolve_arm(name: str) -> Arm:
    """A named arm, or `METHOD+FAULT` (e.g. `eqspec+stale-kv`) for a faulty engine."""
    if name in ARMS:
        return ARMS[name]
    method, plus, fault = name.partition("+")
    if plus and method in ("eqspec", "exspec") and fault in FAULTS:
        return Arm(name, method, fault=fault)
    known = ", ".join(ARMS)
    raise SpecvizError(f"unknown bench arm {name!r}; choose from {known}, or METHOD+FAULT (e.g. eqspec+stale-kv)")


@dataclass
class BenchSettings:
    arms: tuple[str, ...] = ("baseline", "eqspec", "eqspec-loop", "exspec", "exspec-reference", "inplace")
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    draft_ks: tuple[int, ...] = (4, 2, 8)  # the first is the one `results` in the JSON reports
    num_prompts: int = 96
    max_new_tokens: int = 64
    repeats: int = 3
    tracing_repeats: int = 5  # also the watched/unwatched pairs when the eqspec-watched arm runs
    tracing_arms: tuple[str, ...] = ("eqspec", "inplace")  # recorder on vs off, for those of them in `arms`
    window_factor: int = 6  # EXSPEC window = factor x batch size (the paper: 48 at batch 8)
    split: str = "all"
    seed: int = 0
    check: bool = True  # run the invariant checker on each cell's first repeat (verdicts)
    cuda: bool = False  # set by the bench from the device: the first repeat is dropped (cold)

    def validate(self) -> None:
        for name in self.arms:
            resolve_arm(name)
        if "baseline" not in self.arms:
            raise SpecvizError("the bench arms must include 'baseline': speedups are measured against it")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise SpecvizError("batch sizes must be positive")
        if not self.draft_ks or not all(1 <= k <= 64 for k in self.draft_ks):
            raise SpecvizError("draft lengths must be between 1 and 64")
        if self.num_prompts < 1 or self.max_new_tokens < 1 or self.repeats < 1 or self.tracing_repeats < 0:
            raise SpecvizError("--num-prompts, --max-new-tokens and --repeats must be at least 1")
        if self.window_factor < 1:
            raise SpecvizError("--window-factor must be at least 1")
        if self.cuda and self.repeats < CUDA_MIN_REPEATS:
            raise SpecvizError(
                f"on CUDA the bench drops its first repeat (cold): --repeats must be >= {CUDA_MIN_REPEATS}"
            )

    @property
    def timed_repeats(self) -> range:
        """The repeats that count: on CUDA the first is a warm-up over the run's shapes and is dropped."""
        return range(1 if self.cuda else 0, self.repeats)

    @property
    def measured_tracing_arms(self) -> tuple[str, ...]:
        return tuple(a for a in self.tracing_arms if a in self.arms)

    @property
    def primary_k(self) -> int:
        """The headline draft length: the one the JSON `results` and the plots report."""
        return self.draft_ks[0]

    @property
    def grouping_batch(self) -> int:
        """Where group share and tracing are measured: batch 8, or the closest batch size in the grid."""
        return min(self.batch_sizes, key=lambda b: (abs(b - GROUPING_BATCH), b))

    @property
    def grouping_window(self) -> int:
        return self.window_factor * self.grouping_batch


QUICK = BenchSettings(
    arms=("baseline", "eqspec", "eqspec-loop", "exspec", "inplace"),
    batch_sizes=(1, 8, 32),
    draft_ks=(4,),
    num_prompts=32,
    max_new_tokens=16,
    repeats=2,
    tracing_repeats=3,
)


@dataclass(frozen=True)
class Job:
    """One timed decode: an arm at one batch size and draft length."""

    arm: Arm
    batch_size: int
    draft_k: int  # 0 for the baseline

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.arm.name, self.batch_size, self.draft_k)


def jobs_for_batch(settings: BenchSettings, batch_size: int) -> list[Job]:
    """One batch size's runs of one repeat: the baseline once, every other arm per draft length."""
    jobs = [Job(ARMS["baseline"], batch_size, 0)]
    for k in settings.draft_ks:
        jobs += [Job(resolve_arm(name), batch_size, k) for name in settings.arms if name != "baseline"]
    return jobs


def interleaved(jobs: list[Job], repeat: int) -> list[Job]:
    """Rotate the order each repeat, so no arm always runs first (warm caches) or last."""
    shift = repeat % len(jobs)
    return jobs[shift:] + jobs[:shift]


def count_runs(settings: BenchSettings) -> int:
    """Timed decodes in a whole bench (the progress bar's total, with the references)."""
    per_batch = 1 + (len(settings.arms) - 1) * len(settings.draft_ks)
    paired = len(settings.measured_tracing_arms) + (1 if WATCH_ARM in settings.arms else 0)  # on/off pairs
    return settings.repeats * len(settings.batch_sizes) * per_batch + 2 * paired * settings.tracing_repeats
