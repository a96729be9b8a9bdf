"""One run end to end: tokenise prompts, decode the oracle, decode with a method, build the trace.

`RunConfig` (its options) lives in `config.py`; each method's runner in `methods/` (`METHODS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from specviz.engine.batch import SeqState
from specviz.engine.config import RunConfig
from specviz.engine.faults import Fault, make_fault
from specviz.engine.kv.window import refusal as window_refusal
from specviz.engine.kv.window import window_spec
from specviz.engine.methods import METHODS
from specviz.engine.models import ModelPair
from specviz.engine.proposers import Proposer
from specviz.engine.reference import sampled_reference
from specviz.engine.rules import TokenRules
from specviz.engine.sampling import SamplingParams
from specviz.engine.step import Engine, EngineConfig, RunContext
from specviz.errors import SpecvizError
from specviz.proposers import proposer_kind
from specviz.trace.provenance import library_versions, model_info
from specviz.trace.recorder import NullRecorder, Recorder, StepSink, new_header
from specviz.trace.schema import FAULT_FIRES_ON, Header, SamplingInfo, SequenceRecord, Trace
from specviz.trace.token_text import attach_token_text

# progress(phase, done, total): "reference" counts prompts decoded at batch 1, "decode" counts tokens
# emitted. Sequences that end early (EOS) never reach the token budget, so the last "decode" call
# has done == total, the true count: a bar ends at 100%.
Progress = Callable[[str, int, int], None]


def prompt_token_ids(pair: ModelPair, text: str) -> list[int]:
    """How every run tokenises a prompt: the pair's tokenizer on the raw text, nothing added."""
    return list(pair.tokenizer(text)["input_ids"])


def position_limit(pair: ModelPair) -> int | None:
    """The target's maximum positions (prompt + new tokens), or None when its config has no limit."""
    return getattr(pair.target.config, "max_position_embeddings", None)


def fits_positions(pair: ModelPair, ids: list[int], max_new_tokens: int) -> bool:
    limit = position_limit(pair)
    return limit is None or len(ids) + max_new_tokens <= limit


def tokenize_prompts(pair: ModelPair, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    limit = position_limit(pair)
    out = []
    for i, text in enumerate(prompts):
        ids = prompt_token_ids(pair, text)
        if not ids:
            raise SpecvizError(f"prompt {i} tokenises to nothing")
        if not fits_positions(pair, ids, max_new_tokens):
            raise SpecvizError(
                f"prompt {i} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} it "
                f"exceeds the target's {limit} positions"
            )
        out.append(ids)
    return out


def detokenize(ids: list[int], tokenizer: Any) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def run(
    pair: ModelPair,
    prompts: list[str],
    config: RunConfig,
    progress: Progress | None = None,
    steps_to: StepSink | None = None,
) -> Trace:
    """Decode `prompts` with `config.method`; a KeyboardInterrupt yields an incomplete trace.

    `steps_to`: a sink (`ParquetTraceWriter`) that takes each step as it is recorded; the trace
    returned then has no steps in memory, and the caller closes the sink with its header and
    sequences."""
    config.validate()
    if drafts_with_the_draft_model(config) and pair.draft is None:
        raise SpecvizError(f"--proposer {config.proposer} needs a draft model (or another --proposer)")
    torch.manual_seed(config.seed)
    prompt_ids = tokenize_prompts(pair, prompts, config.max_new_tokens)
    refuse_unmaskable_windows(pair, prompt_ids, config)
    eos = frozenset(pair.eos_token_ids)
    fault = make_fault(config.fault)
    method = METHODS[config.method]
    proposer = make_proposer(pair, config)
    header = _header(pair, config, fault, eos)
    recorder = Recorder(header, sink=steps_to) if config.record_steps else NullRecorder(header)
    references, complete = _references(pair, prompt_ids, config, progress)
    seqs = [SeqState(seq_id=i, prompt_ids=ids) for i, ids in enumerate(prompt_ids)]
    tokens = _TokenProgress(progress, seqs, config.max_new_tokens)
    engine = Engine(_engine_config(pair, config, fault, eos, proposer), RunContext(recorder=recorder, on_tokens=tokens))
    failure: str | None = None
    started = engine.now()
    try:
        if complete:  # else interrupted while decoding the reference: record no steps
            header.options.update(method.run(engine, seqs, config))
    except KeyboardInterrupt:
        complete = False
    except torch.OutOfMemoryError:
        failure = f"out of memory at batch size {config.batch_size}; lower --batch-size or --max-new-tokens"
        complete = False
    decode_seconds = engine.now() - started
    header.fault_events = engine.fault_events
    if config.record_steps:  # what tracing cost inside this run (recording and the KV check)
        header.options["tracing_seconds"] = round(engine.context.tracing_seconds, 6)
    if engine.context.kv_check_unavailable is not None:
        header.options["kv_check_unavailable"] = engine.context.kv_check_unavailable
    records = [_sequence_record(seq, prompts[seq.seq_id], pair, references) for seq in seqs]
    trace = recorder.finish(records, complete, decode_seconds)
    # The tokenizer is at hand only here: every trace carries the text of its tokens.
    attach_token_text(trace, pair.tokenizer, recorder.step_token_ids)
    if complete:
        tokens.close()
    if failure is not None:
        raise RunFailed(trace, failure)
    if not complete:
        raise RunInterrupted(trace)
    return trace


def _references(
    pair: ModelPair, prompt_ids: list[list[int]], config: RunConfig, progress: Progress | None
) -> tuple[list[tuple[list[int], list[float]]] | None, bool]:
    """The oracle per prompt (None: not wanted), and False if Ctrl-C interrupted it (kept so far)."""
    params = config.sampling_params
    # Rejection sampling is distribution-exact, not token-exact: no per-token reference exists.
    if not config.reference or params.mode == "rejection":
        return None, True
    references: list[tuple[list[int], list[float]]] = []
    try:
        greedy_references(pair, prompt_ids, config.max_new_tokens, progress, references, params)
    except KeyboardInterrupt:
        return references, False
    return references, True


class _TokenProgress:
    """`on_tokens` for the run context: reports "decode" progress as tokens are emitted.

    The total is what can still come: the tokens emitted so far plus each unfinished sequence's
    remaining budget, so a sequence that stops early at EOS shrinks the total instead of leaving
    the bar short until a jump to 100% at the end."""

    def __init__(self, progress: Progress | None, seqs: list[SeqState], max_new_tokens: int) -> None:
        self.progress, self.seqs, self.max_new = progress, seqs, max_new_tokens
        self.total, self.emitted = len(seqs) * max_new_tokens, 0

    def __call__(self, count: int) -> None:
        self.emitted += count
        if self.progress is not None:
            left = sum(self.max_new - len(s.output_ids) for s in self.seqs if not s.done)
            self.total = self.emitted + left
            self.progress("decode", self.emitted, self.total)

    def close(self) -> None:
        """Sequences that ended early never reach the budget: close the bar at its true count."""
        if self.progress is not None and 0 < self.emitted < self.total:
            self.progress("decode", self.emitted, self.emitted)


def _header(pair: ModelPair, config: RunConfig, fault: Fault, eos: frozenset[int]) -> Header:
    method = METHODS[config.method]
    header = new_header(
        method=config.method,
        fault=None if fault.name == "none" else fault.name,
        target=model_info(pair.target, pair.target_name, pair.device, pair.dtype),
        draft=model_info(pair.draft, pair.draft_name or "", pair.device, pair.dtype)
        if drafts_with_the_draft_model(config)
        else None,
        draft_k=config.k,
        batch_size=config.batch_size,
        max_new_tokens=config.max_new_tokens,
        eos_token_ids=sorted(eos),
        pad_token_id=pair.pad_token_id,
        seed=config.seed,
        library_versions=library_versions(),
        options=method.options(config),
        sampling=_sampling_info(config.sampling_params),
    )
    header.layout = method.layout  # inplace: per-row regions, no rectangular alignment to check
    if fault.name != "none":  # so a run where it never fired can say where it does (analysis.notes)
        header.options[FAULT_FIRES_ON] = fault.fires_on()
    if config.k > 0:
        header.proposer, header.tree_branches = config.proposer, config.tree_branches
        if config.tree_branches and config.tree_kind != "static":  # an option, not a field: the schema stays 3
            header.options["tree_kind"] = config.tree_kind
    if config.k > 0 and config.proposer == "head":  # which head drafted (the header has no ModelInfo for it)
        default = "the pair's own head" if pair.head is not None else "specviz/assets/default-head"
        header.options["head"] = config.head_path or default
    return header


def make_proposer(pair: ModelPair, config: RunConfig) -> Proposer | None:
    """The run's proposer (the registry's class for `config.proposer`); None for the baseline."""
    if config.k == 0:
        return None
    return proposer_kind(config.proposer).build(pair, config)


def drafts_with_the_draft_model(config: RunConfig) -> bool:
    """Whether the run's proposer drafts with the pair's draft model (so the run must load it)."""
    return config.k > 0 and proposer_kind(config.proposer).needs_draft_model


def _engine_config(
    pair: ModelPair, config: RunConfig, fault: Fault, eos: frozenset[int], proposer: Proposer | None
) -> EngineConfig:
    return EngineConfig(
        target=pair.target,
        draft=None,  # set from the proposer: the draft model's, or none
        proposer=proposer,
        tree_branches=config.tree_branches,
        tree_kind=config.tree_kind,
        k=config.k,
        max_new_tokens=config.max_new_tokens,
        eos_ids=eos,
        pad_id=pair.pad_token_id,
        device=pair.device,
        fault=fault,
        rules=TokenRules(config.sampling_params),
        kv_check_every=config.kv_check_every if config.record_steps else 0,
    )


class RunInterrupted(KeyboardInterrupt):
    """Raised after Ctrl-C with the partial trace, so the caller can still save it."""

    def __init__(self, trace: Trace) -> None:
        super().__init__("run interrupted")
        self.trace = trace


class RunFailed(SpecvizError):
    """The run stopped on a resource error; `trace` holds every finished step (incomplete)."""

    def __init__(self, trace: Trace, message: str) -> None:
        super().__init__(message)
        self.trace = trace


def refuse_unmaskable_windows(pair: ModelPair, prompt_ids: list[list[int]], config: RunConfig) -> None:
    """Before any compute: a sliding-window model the engine cannot mask per row, in a run that
    could reach its window (longest prompt + new tokens + drafts in one row), is refused in one line."""
    longest = max((len(ids) for ids in prompt_ids), default=0) + config.max_new_tokens + config.k
    models = [(pair.target, pair.target_name)]
    if config.tree_branches and window_spec(pair.target).windowed:
        raise SpecvizError(
            f"{pair.target_name}: tree verification does not support sliding-window models yet (use --tree 0)"
        )
    if drafts_with_the_draft_model(config) and pair.draft is not None:
        models.append((pair.draft, pair.draft_name or "draft"))
    for model, name in models:
        line = window_refusal(model, name, longest)
        if line is None and config.method == "inplace":
            line = inplace_window_refusal(model, name, longest)
        if line is not None:
            raise SpecvizError(line)


def inplace_window_refusal(model: Any, name: str, longest_context: int) -> str | None:
    """`inplace` feeds one 4-D mask to every layer, so a sliding layer would see past its window."""
    spec = window_spec(model)
    if not spec.windowed or longest_context <= spec.window:
        return None
    return (
        f"{name}: sliding window of {spec.window} tokens, and this run reaches {longest_context} slots; "
        f"--method inplace does not mask sliding windows yet (use eqspec or exspec, or stay within the window)"
    )


def greedy_references(
    pair: ModelPair,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    progress: Progress | None = None,
    out: list[tuple[list[int], list[float]]] | None = None,
    params: SamplingParams | None = None,
) -> list[tuple[list[int], list[float]]]:
    """The batch-1 oracle (tokens, margins) per prompt: greedy, or coupled sampling with `params`.

    Prompt i is sequence i, the key of its sampling noise. `out` is filled in place, so a caller
    interrupted mid-way keeps the references finished so far.
    """
    out = [] if out is None else out
    params = params or SamplingParams()
    eos = frozenset(pair.eos_token_ids)
    for i, ids in enumerate(prompt_ids):
        out.append(sampled_reference(pair.target, ids, max_new_tokens, eos, pair.device, params, seq_id=i))
        if progress is not None:
            progress("reference", i + 1, len(prompt_ids))
    return out


def _sequence_record(
    seq: SeqState, prompt: str, pair: ModelPair, references: list[tuple[list[int], list[float]]] | None
) -> SequenceRecord:
    have_reference = references is not None and seq.seq_id < len(references)
    ref_ids, ref_margins = references[seq.seq_id] if have_reference else (None, None)
    return SequenceRecord(
        seq_id=seq.seq_id,
        prompt=prompt,
        prompt_ids=seq.prompt_ids,
        output_ids=seq.output_ids,
        output_text=detokenize(seq.output_ids, pair.tokenizer),
        reference_ids=ref_ids,
        reference_margins=ref_margins,
        finish_reason=seq.finish_reason,
    )


def _sampling_info(params: SamplingParams) -> SamplingInfo | None:
    """Greedy runs write no sampling field (as every trace before it); sampling runs all of it."""
    if params.greedy:
        return None
    return SamplingInfo(params.mode, params.temperature, params.top_p, params.top_k, params.seed)
