"""The trace: what one decoding run records, as plain dataclasses.

A trace is enough to replay the ragged state of every step without the models (docs/trace-format.md).
It is serialised as JSON (optionally gzip-compressed), never pickled; `docs/trace-format.md`
documents every field and `docs/trace.schema.json` is the JSON Schema other engines can target.

Layout assumed by the per-row fields: left-padded contiguous. For the verify pass of a step, the
attention mask row covers `cache_len` cached slots followed by `query_len` query slots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 5
OLDEST_READABLE_VERSION = 1  # version-1 to -4 files lack only optional fields (or a chunk's carrier)
FORMAT_NAME = "specviz-trace"

METHODS = ("baseline", "eqspec", "exspec", "inplace")


@dataclass
class RowRecord:
    """One batch row in one step: what was fed to the verify pass and what came out."""

    row: int  # index of the row inside this step's batch
    seq_id: int  # the sequence (prompt) this row holds
    committed_before: int  # prompt + emitted tokens before the step (incl. the pending token)
    left_pad: int  # leading padding slots of the cache before the verify pass
    left_pad_after: int | None  # leading padding after realignment (None: row left the batch)
    pending_token: int  # first query token: the last committed token, whose KV is not cached yet
    draft_tokens: list[int]  # the k draft proposals (empty for plain greedy)
    target_tokens: list[int]  # the target's argmax at each query slot (len = query_len)
    accepted: int  # drafts accepted by verification (a_r)
    bonus: int | None  # the target's own token after the accepted prefix (None if cut)
    emitted: list[int]  # tokens actually appended to the sequence this step
    write_seq: int  # sequence the emitted tokens were written to (== seq_id when correct)
    position_ids: list[int]  # position IDs fed for the query slots
    mask_rle: list[list[int]]  # attention-mask row fed, run-length coded [[value, count], ...]
    kv_len: int  # cache slots the mask lets this row attend (actual)
    kv_len_expected: int  # what a correct engine holds: committed_before - 1
    draft_kv_len: int | None = None  # draft cache slots attended at the first draft pass
    draft_kv_len_expected: int | None = None
    finished: bool = False  # the row is done after this step
    finish_reason: str | None = None  # "eos" | "length" | None
    # Schema version 2, all optional (None / False: not recorded). Written only where recorded.
    query_causal: bool | None = None  # the verify query block of a 4-D mask was causal
    draft_position_ids: list[int] | None = None  # per draft call: position of its last query token
    draft_kv_lens: list[int] | None = None  # per draft call: slots that token attends before itself
    kv_content_checked: bool = False  # layer-0 keys of the attended slots were recomputed
    kv_mismatch_slot: int | None = None  # first attended cache slot whose key did not match
    # Schema version 3, all optional (None: not recorded). Tree verification: the query block is a
    # tree of N nodes, node 0 the pending token; draft_tokens, target_tokens and position_ids then
    # hold nodes 1..N-1, 0..N-1 and 0..N-1 (node order).
    tree_parents: list[int] | None = None  # parent node of each node (-1 for node 0)
    tree_depths: list[int] | None = None  # depth of each node (node 0: 0)
    node_attends: list[list[int]] | None = None  # per node: the query-block nodes it attended
    tree_path: list[int] | None = None  # the accepted nodes, root excluded, root to leaf
    kept_nodes: list[int] | None = None  # query-block nodes whose KV the commit kept attended
    # Head drafting: [seq_id, logical index] of the target hidden state fed to the row's head this
    # step; [] when none was (a one-token prompt's first step).
    head_source: list[int] | None = None
    # Schema version 4, all optional (None: not recorded). A draft model's input per draft call:
    # the token it fed (the pending token, then the row's own drafts).
    draft_input_tokens: list[int] | None = None
    # A repetition penalty's token history (header.sampling.repetition_penalty != 1): its length
    # before the step, and the tokens the step appended to it. With the sequence's prompt they
    # are the whole history after every step.
    penalty_history_len: int | None = None
    penalty_added: list[int] | None = None
    # A chunked prefill (header.options["prefill_chunk"]), on the row of the sequence's first step
    # after it: each target chunk [start, end, position of its first token, attended slots before
    # it, carrier], in order; and the tokens the draft was fed, in order. Version 5 added the
    # carrier: the step whose verify forward also carried the chunk (EXSPEC's mixed prefill,
    # engine/mixed.py), -1 for a target forward of its own; version-4 chunks have 4 items.
    prefill_chunks: list[list[int]] | None = None
    draft_prefill_tokens: list[int] | None = None


@dataclass
class StepRecord:
    """One verify step of one batch."""

    step: int  # global step counter over the run
    batch_id: int  # which batch (static batches) or 0 (one pool)
    cache_len: int  # physical width of the target cache fed to the verify pass
    query_len: int  # query slots per row (k + 1, or 1 for plain greedy)
    grouped: bool | None  # exspec: batch was an equal-length group (no padding); else None
    draft_ms: float
    verify_ms: float
    align_ms: float  # realignment / grouping / cache moves
    total_ms: float
    rows: list[RowRecord]


@dataclass
class SequenceRecord:
    """One prompt and what became of it."""

    seq_id: int
    prompt: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_text: str
    reference_ids: list[int] | None  # batch-1 greedy decoding of the target (the oracle)
    reference_margins: list[float] | None  # reference's top-1 minus top-2 logit per token
    finish_reason: str | None  # "eos" | "length" | None (unfinished run)


@dataclass
class ModelInfo:
    name: str
    dtype: str
    device: str
    vocab_size: int
    num_parameters: int


@dataclass
class SamplingInfo:
    """Schema version 2, optional: how tokens were chosen (absent or null: greedy).

    `coupled`: draft and target sample with noise keyed by (seed, seq_id, logical index), so the
    output is token-exact against the coupled batch-1 reference. `rejection`: speculative
    rejection sampling, distribution-exact only (the reference is not recorded).
    """

    mode: str  # "greedy" | "coupled" | "rejection"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int = 0
    # Schema version 4, optional: transformers' repetition penalty (1: off). A greedy run with a
    # penalty writes this object with mode "greedy".
    repetition_penalty: float = 1.0


# `header.options` key specviz's engine writes with a fault: where the fault fires ("exspec", "eqspec
# with --proposer head"), so a run where it never fired can say so (specviz.analysis.notes).
FAULT_FIRES_ON = "fault_fires_on"


@dataclass
class Header:
    schema_version: int
    method: str
    fault: str | None
    target: ModelInfo
    draft: ModelInfo | None
    draft_k: int
    batch_size: int
    max_new_tokens: int
    eos_token_ids: list[int]
    pad_token_id: int | None
    seed: int
    created_at: str
    library_versions: dict[str, str]
    engine: str = "specviz"
    options: dict[str, Any] = field(default_factory=dict)  # method-specific (exspec window...)
    complete: bool = True  # False: run interrupted; steps and sequences hold what finished
    finished_at: str | None = None
    decode_seconds: float | None = None  # wall time of decoding, device synchronised
    # What the fault actually did: (step, row, seq_id, what). Written by the faulty engine for
    # tests and docs; the forensics never read it, they infer everything from the state fields.
    fault_events: list[dict[str, Any]] = field(default_factory=list)
    # Schema version 2: the layout the engine declares. "left-padded" (specviz's engine, and every
    # version-1 file) adds the rectangular-alignment rule; "unspecified" (watched engines) gets
    # only the layout-free invariants.
    layout: str = "left-padded"
    sampling: SamplingInfo | None = None  # schema version 2: None (and absent) means greedy
    # Schema version 2, optional: the text of every token ID the trace uses, `{"<id>": "<text>"}`
    # (JSON keys are strings), written by whoever held the tokenizer, so views and `check` show
    # text without it. Empty (and absent): IDs only. Version-2 files of an earlier draft kept it
    # in `options["token_text"]`, which readers still accept.
    token_text: dict[str, str] = field(default_factory=dict)
    # Schema version 3, optional: what proposed the drafts ("draft-model", "head", "ngram"; absent:
    # a draft model, as in every earlier file) and the tree's alternatives per step (0: a chain).
    proposer: str = "draft-model"
    tree_branches: int = 0


LAYOUTS = ("left-padded", "fixed-slots", "unspecified")  # fixed-slots: per-row regions (inplace)


@dataclass
class Trace:
    header: Header
    steps: list[StepRecord]
    sequences: list[SequenceRecord]

    @property
    def batch_rows(self) -> int:
        """The batch the run had: `header.batch_size` (what was asked) cut to the prompts there were.
        `--batch-size 100000` over 48 prompts decodes 48 rows at most; a summary says 48."""
        asked = self.header.batch_size
        return min(asked, len(self.sequences)) if self.sequences else asked


# Optional row fields that most rows leave unrecorded: written only when recorded, so a run that
# records them on a sampled few rows does not pay their bytes on every row (the loader restores
# the defaults).
TREE_ROW_FIELDS = ("tree_parents", "tree_depths", "node_attends", "tree_path", "kept_nodes", "head_source")
# Columns added by schema version 4: a file written before them lacks them.
V4_ROW_FIELDS = ("draft_input_tokens", "penalty_history_len", "penalty_added", "prefill_chunks", "draft_prefill_tokens")
# Of these, the ones only the row walk checks: a Parquet row group recording them is not judged a
# column at a time (analysis/arrays.py).
ROW_WALK_FIELDS = (*TREE_ROW_FIELDS, "penalty_history_len", "penalty_added", "prefill_chunks", "draft_prefill_tokens")
SPARSE_ROW_FIELDS = (
    "query_causal",
    "draft_position_ids",
    "draft_kv_lens",
    *V4_ROW_FIELDS,
    "kv_content_checked",
    "kv_mismatch_slot",
    *TREE_ROW_FIELDS,
)


# What a sparse field holds when unrecorded: the one value it is written without.
_UNRECORDED = {f.name: f.default for f in dataclasses.fields(RowRecord) if f.name in SPARSE_ROW_FIELDS}


def json_fields(obj: Any) -> dict[str, Any]:
    """json.dumps hook: our dataclasses hold only JSON values and other dataclasses."""
    if type(obj) is RowRecord:
        # Left out only at its default, by identity: slot 0 is a recorded value (0 == False), and a
        # `query_causal` of False is a finding (its default is None: not read).
        fields = obj.__dict__
        return {k: v for k, v in fields.items() if k not in SPARSE_ROW_FIELDS or v is not _UNRECORDED[k]}
    if dataclasses.is_dataclass(obj):
        return obj.__dict__
    raise TypeError(f"cannot serialise {type(obj).__name__} in a trace")
