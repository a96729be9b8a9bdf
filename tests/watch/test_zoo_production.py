"""Production-shaped engines (`tests/watch/zoo/`: `packed`, `queued`, `paged`, `head`), written
without specviz, watched through the API (`with specviz.watch(...) as w`) and through the command
(`specviz watch -- python tests/watch/zoo/scripts/run_engine.py ...`, run in-process as the
command runs it). The truth is independent of specviz: each correct engine equals batch-1 greedy
decoding of the target on every prompt, each to its own budget (`shapes.reference`, no hooks).

(a) every correct run checks clean, with 0 violations and exact match 1.0;
(b) every injected bug's first violation is at the (step, sequence) the engine reports, with the
    invariant it breaks;
(c) no wrong output is called clean: a run whose output differs from the reference is desync or
    unreadable, whatever was or was not read.
The cases (CASES) vary each shape the way other engines do: slot pools, boolean masks with varlen
metadata, inputs_embeds, draft calls in another order, declared segments, prompt lookup, chunked
prefills, per-request stop tokens, a draft with its own cache rows, a head over a packed target,
and other model families.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from tiny import make_pair
from zoo import head, packed, paged, queued, shapes

import specviz
from specviz.analysis.check import check_trace
from specviz.cli import main
from specviz.trace.invariants import Invariant
from specviz.trace.io import load_trace
from specviz.watch import WatchError

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]  # each request's own max_new_tokens: rows finish early
ONE_BUDGET = 10
SCRIPT = Path(__file__).parent / "zoo" / "scripts" / "run_engine.py"
MODES = ["api", "command"]
# case: (module, budgets, engine options). `paged_batch` is `model.generate_batch` itself (one
# budget for all); `paged` drives the same manager with a budget per request; `paged_chunked` lets
# 5 query tokens into a forward, so prefills are cut into chunks (forwards that give no token).
CASES = {
    "packed": (packed, BUDGETS, {}),
    "queued": (queued, BUDGETS, {}),
    "queued_draft_cache": (queued, BUDGETS, {"draft_cache": 1}),  # the draft keeps its own cache rows
    "paged": (paged, BUDGETS, {}),
    "paged_batch": (paged, ONE_BUDGET, {}),
    "paged_chunked": (paged, BUDGETS, {"tokens": 5}),
    # Every request stops at token 24 (the generation config's eos, not the model's): one ends early.
    "paged_eos": (paged, BUDGETS, {"eos": 24}),
    "head": (head, BUDGETS, {}),
    "head_packed": (head, BUDGETS, {"packed": 1}),  # the head over a packed target (vLLM's EAGLE)
    # Both caches are 48-slot pools written through a slot mapping; given-back slots are reused.
    "packed_pool": (packed, BUDGETS, {"pool": 48}),
    # No draft model: prompt lookup proposes (some steps verify no drafts); watched with draft=None.
    "packed_lookup": (packed, BUDGETS, {"lookup": 1}),
    # Each forward's segments declared before it (`w.batch(seq_ids, query_lens=...)`): API only.
    "packed_declared": (packed, BUDGETS, {"declare": 1}),
    # The draft calls pack the sequences in the reverse of the verify's order.
    "packed_flip": (packed, BUDGETS, {"flip": 1}),
    # A boolean mask and flash attention's varlen metadata (cu_seq_lens_q/k) on every call.
    "packed_flash": (packed, BUDGETS, {"flash": 1}),
    # Both models fed `inputs_embeds`, no token ids: read (clean) or unreadable, never a false alarm.
    "packed_embeds": (packed, BUDGETS, {"embeds": 1}),
}
READ_OR_UNREADABLE = {"packed_embeds"}
EMBEDS_BUGS = [("packed_embeds", "kv_leak", Invariant.KV), ("packed_embeds", "stale_kv", Invariant.KV)]
BUGS = [
    ("packed", "positions", Invariant.POSITIONS),
    ("packed", "kv_leak", Invariant.KV),
    ("packed", "stale_kv", Invariant.KV),
    ("packed_flash", "kv_leak", Invariant.KV),
    ("packed_flip", "kv_leak", Invariant.KV),
    ("packed_declared", "kv_leak", Invariant.KV),
    ("packed_lookup", "kv_leak", Invariant.KV),
    ("packed_lookup", "stale_kv", Invariant.KV),
    # A row of a shared cache is the sequence whose slots it mostly attends, not the one whose first
    # slot it attends: a leak of slot 0 (the first sequence's first slot, the cache's lowest) into
    # the row with the shortest context and into a newcomer's first decoding row, and a leak at a
    # row's last step (no later row of it).
    ("packed", "kv_leak_zero", Invariant.KV),
    ("packed_lookup", "kv_leak_zero", Invariant.KV),
    ("packed", "kv_leak_join", Invariant.KV),
    ("packed_lookup", "kv_leak_join", Invariant.KV),
    ("packed", "kv_leak_last", Invariant.KV),
    ("packed_lookup", "kv_leak_last", Invariant.KV),
    ("packed_declared", "stale_kv", Invariant.KV),
    ("packed_pool", "reuse", Invariant.KV),
    ("queued", "kv_mixup", Invariant.KV),
    ("queued", "positions", Invariant.POSITIONS),
    ("queued_draft_cache", "draft_mixup", Invariant.KV),
    ("paged", "kv_leak", Invariant.KV),
    ("paged_batch", "kv_leak", Invariant.KV),
    ("paged_chunked", "positions", Invariant.POSITIONS),
    ("paged_chunked", "kv_leak", Invariant.KV),
    ("head", "stale_kv", Invariant.KV),
    ("head", "positions", Invariant.POSITIONS),
    ("head_packed", "stale_kv", Invariant.KV),
    ("head_packed", "positions", Invariant.POSITIONS),
    # The head is fed another row's hidden state: the outputs stay right (the target verifies);
    # the watch matches the vector the head was fed with the target's last hidden states
    # (`watch.headinput`); the command is told which module is the head (`--drafter DraftHead`).
    ("head", "head_row", Invariant.HEAD),
    ("head_packed", "head_row", Invariant.HEAD),
    # The head is fed the hidden states of the step before (a target call older than the latest):
    # found among the target calls the watch keeps (`headinput.HISTORY`).
    ("head", "head_stale", Invariant.HEAD),
    ("head_packed", "head_stale", Invariant.HEAD),
]
# The command declares nothing: these run through the API only.
API_ONLY = {
    ("packed_declared", None),
    ("packed_declared", "kv_leak"),
    ("packed_declared", "stale_kv"),
}


def with_modes(cases: list[tuple]) -> list:
    """Each case through the API and, unless API_ONLY, the command."""
    params = []
    for case in cases:
        for mode in MODES:
            key = (case[0], case[1] if len(case) > 1 else None)  # (case, bug)
            if mode == "api" or key not in API_ONLY:
                params.append(pytest.param(*case, mode, id="-".join(map(str, (*case, mode)))))
    return params


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(scope="module")
def drafter(pair):
    return head.DraftHead(pair.target)


@pytest.fixture(scope="module")
def references(pair):
    """Batch-1 greedy of the target, per prompt, to each case's budgets and stop token (unwatched)."""
    done: dict[tuple, list[list[int]]] = {}
    for budgets, options in [(budgets, options) for _, budgets, options in CASES.values()]:
        key = (str(budgets), options.get("eos"))
        if key not in done:
            done[key] = shapes.reference(pair.target, PROMPTS, budgets, eos=options.get("eos"))
    return {name: done[str(budgets), options.get("eos")] for name, (_, budgets, options) in CASES.items()}


class Runs:
    """Each (case, bug, mode) run once for the module: (trace, outputs, events)."""

    def __init__(self, pair, drafter, tmp: Path) -> None:
        self.pair, self.drafter, self.tmp, self.done = pair, drafter, tmp, {}

    def get(self, name: str, bug: str | None, mode: str):
        key = (name, bug, mode)
        if key not in self.done:
            self.done[key] = self._api(name, bug) if mode == "api" else self._command(name, bug)
        return self.done[key]

    def _api(self, name: str, bug: str | None):
        module, budgets, options = CASES[name]
        target = self.pair.target
        if module is head:
            second, watched = self.drafter, specviz.watch(target, drafter=self.drafter, prompts=PROMPTS, name=name)
        elif module is paged or options.get("lookup"):
            second, watched = None, specviz.watch(target, prompts=PROMPTS, name=name)
        else:
            second, watched = self.pair.draft, specviz.watch(target, self.pair.draft, prompts=PROMPTS, name=name)
        with watched as w:
            outs, events = module.generate(target, second, PROMPTS, budgets, bug=bug, w=w, **options)
        return w.trace, outs, [tuple(e) for e in events]

    def _command(self, name: str, bug: str | None):
        module, budgets, options = CASES[name]
        out = self.tmp / f"{name}-{bug}.trace.json"
        argv = ["watch", "--out", str(out), *(["--drafter", "DraftHead"] if module is head else [])]
        argv += ["--", "python", str(SCRIPT), module.__name__.rsplit(".", 1)[-1]]
        argv += ["--prompts", json.dumps(PROMPTS), "--budgets", ",".join(map(str, shapes.budgets(budgets, 1)))]
        argv += ["--bug", bug] if bug else []
        argv += [arg for key, value in options.items() for arg in ("--set", f"{key}={value}")]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(argv) == 0
        said = [line.split(" ", 1) for line in printed.getvalue().splitlines()]
        lines = {words[0]: words[1] for words in said if words[0] in ("OUTS", "EVENTS")}
        return load_trace(out), json.loads(lines["OUTS"]), [tuple(e) for e in json.loads(lines["EVENTS"])]


@pytest.fixture(scope="module")
def runs(pair, drafter, tmp_path_factory):
    return Runs(pair, drafter, tmp_path_factory.mktemp("production"))


def test_correct_engines_equal_batch1_greedy_and_mix_acceptance(pair, drafter, references) -> None:
    """The oracle, without specviz: each engine's correct output is batch-1 greedy, each prompt to
    its own budget (every case's: `test_correct_engine_checks_clean`), emitted as it is returned;
    the speculative ones have rows that accept everything and rows that accept nothing (a step
    that emits k + 1 tokens, one that emits a single token before the row's end, with drafts)."""
    for name in ("packed", "queued", "paged", "head"):
        module, budgets, options = CASES[name]
        emitted = Recorder()
        second = drafter if module is head else None if module is paged else pair.draft
        if module is paged:
            options = {**options, "emit": "step"}  # its own per-step report, from the manager
        outs, events = module.generate(pair.target, second, PROMPTS, budgets, w=emitted, **options)
        assert outs == references[name] and not events, name
        assert [len(o) for o in outs] == shapes.budgets(budgets, len(PROMPTS)), name
        assert [emitted.tokens.get(s, []) for s in range(len(PROMPTS))] == outs, name
        if module is not paged:
            k = 3 if module is packed else 2
            assert any(len(tokens) == k + 1 for tokens, _ in emitted.steps), name  # every draft accepted
            assert any(len(tokens) == 1 and not end for tokens, end in emitted.steps), name  # none accepted


class Recorder:
    """A stand-in for the watch's two calls, to see what an engine emits (no specviz)."""

    def __init__(self) -> None:
        self.steps: list[tuple[list[int], str | None]] = []  # each emit: its tokens, its ending
        self.tokens: dict[int, list[int]] = {}

    def rows(self, seq_ids, model=None) -> None:
        pass

    def emit(self, seq: int, tokens, finish_reason=None) -> None:
        self.steps.append((list(tokens), finish_reason))
        self.tokens.setdefault(seq, []).extend(tokens)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("name", "mode"), with_modes([(name,) for name in CASES if name not in READ_OR_UNREADABLE]))
def test_correct_engine_checks_clean(runs, references, name: str, mode: str) -> None:
    trace, outs, _ = runs.get(name, None, mode)
    assert outs == references[name]
    report = check_trace(trace)
    assert report.verdict == "clean", (report.verdict, report.violations[:3])
    assert not report.violation_count and report.exact_match == 1.0
    # The command numbers sequences as it meets them (a manager may start with its last request):
    # each prompt's sequence, by its prompt.
    by_prompt = {tuple(s.prompt_ids): s for s in trace.sequences}
    assert len(by_prompt) == len(trace.sequences) == len(PROMPTS)
    assert [by_prompt[tuple(p)].output_ids for p in PROMPTS] == outs
    if mode == "api":
        assert [s.prompt_ids for s in trace.sequences] == PROMPTS
    written = {s.seq_id: 0 for s in trace.sequences}
    for step in trace.steps:
        for row in step.rows:
            written[row.write_seq] += len(row.emitted)
    assert [written[by_prompt[tuple(p)].seq_id] for p in PROMPTS] == [len(o) for o in outs]  # every token placed


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("name", "bug", "invariant", "mode"), with_modes(BUGS))
def test_injected_bug_is_located(runs, name: str, bug: str, invariant: Invariant, mode: str) -> None:
    trace, _, events = runs.get(name, bug, mode)
    assert events, f"{bug} never fired"
    step, seq = events[0]
    seq_id = {tuple(s.prompt_ids): s.seq_id for s in trace.sequences}.get(tuple(PROMPTS[seq]))
    report = check_trace(trace)
    v = report.first_violation
    assert v is not None, (report.verdict, report.skipped_checks)
    assert (v.step, v.seq_id, v.invariant) == (step, seq_id, invariant), report.violations[:3]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(
    ("name", "bug", "mode"), with_modes([(n, None) for n in CASES] + [(n, b) for n, b, _ in BUGS + EMBEDS_BUGS])
)
def test_no_wrong_output_is_called_clean(runs, references, name: str, bug: str | None, mode: str) -> None:
    trace, outs, _ = runs.get(name, bug, mode)
    report = check_trace(trace)
    wrong = [s for s, (out, ref) in enumerate(zip(outs, references[name])) if out != ref]
    if wrong:
        assert report.verdict in ("desync", "unreadable"), (wrong, report.verdict)
    if report.verdict == "clean":
        assert outs == references[name]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "bug", "invariant"), [("packed_embeds", None, None), *EMBEDS_BUGS])
def test_tokens_fed_as_embeddings_are_read_or_unreadable(
    runs, references, name: str, bug: str | None, invariant: Invariant | None, mode: str
) -> None:
    """The packed engine feeding `inputs_embeds`: the watch reads the tokens (the correct run clean
    and exact, each bug at its place) or says unreadable from some step S, having checked the
    steps before S as usual (a bug before S is still located). Never desync on the correct run."""
    trace, outs, events = runs.get(name, bug, mode)
    assert outs == references[name] if bug is None else events
    report = check_trace(trace)
    v = report.first_violation
    if report.verdict == "unreadable":
        assert report.unreadable and report.unreadable.get("why")
        if bug is None or report.unreadable["step"] <= events[0][0]:
            return
    elif bug is None:
        assert report.verdict == "clean" and not report.violation_count and report.exact_match == 1.0, v
        return
    step, seq = events[0]
    seq_id = {tuple(s.prompt_ids): s.seq_id for s in trace.sequences}.get(tuple(PROMPTS[seq]))
    assert v is not None and (v.step, v.seq_id, v.invariant) == (step, seq_id, invariant), report.violations[:3]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_packed_engine_on_other_model_families(family: str) -> None:
    """The packed engine over GPT-2 (learned absolute positions) and GPT-NeoX (partial rotary)
    tiny pairs, through the API: the correct run clean and exact, the neighbour leak located."""
    other = make_pair(family)
    expected = shapes.reference(other.target, PROMPTS, BUDGETS)
    for bug in (None, "kv_leak"):
        with specviz.watch(other.target, other.draft, prompts=PROMPTS, name=f"packed-{family}") as w:
            outs, events = packed.generate(other.target, other.draft, PROMPTS, BUDGETS, bug=bug, w=w)
        report = check_trace(w.trace)
        v = report.first_violation
        if bug is None:
            assert outs == expected
            assert report.verdict == "clean" and report.exact_match == 1.0, (report.verdict, v, report.unreadable)
        else:
            assert events and v is not None, (report.verdict, report.unreadable)
            assert (v.step, v.seq_id, v.invariant) == (*events[0], Invariant.KV), report.violations[:3]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["head", "head_packed"])
def test_head_input_source_is_recorded(runs, name: str, mode: str) -> None:
    """The correct head run records each drafting row's head input as its own sequence's hidden
    state at its last cached token (matched with the target's hidden states, not assumed): the
    check's clean verdict on it is a checked one, through the API and the command alike."""
    trace, _, _ = runs.get(name, None, mode)
    assert trace.header.proposer == "head"
    drafting = [row for step in trace.steps for row in step.rows if row.draft_tokens]
    assert drafting
    assert all(row.head_source == [row.seq_id, row.committed_before - 2] for row in drafting)
    assert not any("draft head" in note for note in trace.header.options.get("watch_notes", []))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_head_fed_no_target_hidden_state_is_left_unchecked(pair, drafter, references, monkeypatch) -> None:
    """A head fed a vector that is no target hidden state of the previous call (here: each one
    shifted) has no source to name: its rows are left unrecorded, never guessed, so the run's
    right outputs are not called wrong."""
    propose = head.propose
    monkeypatch.setattr(head, "propose", lambda h, t, last, *a: propose(h, t, last + 0.5, *a))
    _, budgets, options = CASES["head"]
    with specviz.watch(pair.target, drafter=drafter, prompts=PROMPTS, name="shifted") as w:
        outs, _ = head.generate(pair.target, drafter, PROMPTS, budgets, w=w, **options)
    assert outs == references["head"]
    assert all(row.head_source is None for step in w.trace.steps for row in step.rows)
    assert any("draft head input unreadable" in note for note in w.trace.header.options["watch_notes"])
    report = check_trace(w.trace)
    assert report.verdict == "clean" and not report.violation_count, report.violations[:3]


# Other prompt and budget mixes of the packed engine: the four prompts (the leak's first
# violation is at its own step and sequence, not an accounting one before it); a late newcomer
# that arrives after every other request has ended (prefilled alone over the shared cache, a new
# sequence, not the last one's row continued); six prompts.
LATE_ALONE = ([[20, 21], [5, 6, 7, 8, 9, 10], [11, 12, 13]], [5, 1, 7])
MIXES = {
    "four": (PROMPTS[:4], [9, 3, 6, 2]),
    "late_alone": LATE_ALONE,
    "six": ([[30, 31, 32, 33, 34], *PROMPTS[:4], [50, 51, 52]], [7, 2, 5, 9, 3, 6]),
}
MIX_BUGS = [("four", "kv_leak"), ("late_alone", "stale_kv"), ("six", "kv_leak_zero")]


def _packed_mix(pair, prompts, budgets, bug, mode, tmp: Path):
    """The packed engine on `prompts`/`budgets`, watched through the API or the command."""
    if mode == "api":
        with specviz.watch(pair.target, pair.draft, prompts=prompts, name="mix") as w:
            outs, events = packed.generate(pair.target, pair.draft, prompts, budgets, bug=bug, w=w)
        return w.trace, outs, [tuple(e) for e in events]
    out = tmp / f"mix-{bug}.trace.json"
    argv = ["watch", "--out", str(out), "--", "python", str(SCRIPT), "packed", "--prompts", json.dumps(prompts)]
    argv += ["--budgets", ",".join(map(str, budgets)), *(["--bug", bug] if bug else [])]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    said = dict(line.split(" ", 1) for line in printed.getvalue().splitlines() if line.startswith(("OUTS", "EVENTS")))
    return load_trace(out), json.loads(said["OUTS"]), [tuple(e) for e in json.loads(said["EVENTS"])]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("mix", "bug"), [(m, None) for m in MIXES] + MIX_BUGS)
def test_packed_prompt_and_budget_mixes(pair, tmp_path, mix: str, bug: str | None, mode: str) -> None:
    """Each mix: the correct run equals batch-1 greedy and checks clean; each bug's first violation
    is at the (step, sequence) the engine reports, with its invariant."""
    prompts, budgets = MIXES[mix]
    trace, outs, events = _packed_mix(pair, prompts, budgets, bug, mode, tmp_path)
    report = check_trace(trace)
    v = report.first_violation
    if bug is None:
        assert outs == shapes.reference(pair.target, prompts, budgets) and not events
        assert report.verdict == "clean" and report.exact_match == 1.0, (v, report.unreadable)
        return
    assert events, f"{bug} never fired"
    step, seq = events[0]
    seq_id = {tuple(s.prompt_ids): s.seq_id for s in trace.sequences}.get(tuple(prompts[seq]))
    assert v is not None and (v.step, v.seq_id, v.invariant) == (step, seq_id, Invariant.KV), report.violations[:3]


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_packed_engine_watched_without_prompts_says_what_is_missing(pair) -> None:
    """Without `prompts=`, the prompts are read from the first target call; the packed engine's late
    request is emitted but was not in that call: one clear error (it was a KeyError traceback)."""
    with pytest.raises(WatchError, match=r"emit named sequence 3, .* pass prompts="):
        with specviz.watch(pair.target, pair.draft, name="no-prompts") as w:
            packed.generate(pair.target, pair.draft, PROMPTS[:4], [9, 3, 6, 2], w=w)
