"""Runner records -> one trace step per runner step (and a `BatchMap` each, on request), from what vLLM
declared (docs/vllm.md section 3). A record's draft calls propose the next step's drafts, so they fill
the next step's rows; a row's mask says which attended slots hold its request's own tokens (`slots`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from specviz.trace.schema import RowRecord, StepRecord
from specviz.watch.map import BatchMap, Segment
from specviz.watch.vllm.slots import ROOT, SlotLedger, block_slots, join_runs, prefixes, runs

# vLLM's speculative method -> the trace's proposer (none: the schema's default). Any other is a head (fed
# token p + 1 at position p): only a draft model's calls are judged (call j feeds token n - 1 + j there).
PROPOSERS = {None: "draft-model", "ngram": "ngram", "draft_model": "draft-model"}
HEAD = "its draft calls feed token p + 1 at position p; the draft-side checks do not apply"  # a head's note
NO_DRAFTS: dict[str, Any] = {"draft_calls": [], "req_ids": [], "block_size": 1}  # no record drafted this step's drafts


@dataclass
class Request:
    """One request as the scheduler handed it over, and what the run wrote to it."""

    seq: int  # its index in the run: the order vLLM first scheduled it (the prompt's, for one generate call)
    req_id: str
    prompt: list[int]
    max_tokens: int | None  # vLLM fills an unset one (v1/engine/input_processor.py): None only made by hand
    stop_ids: Collection[int]
    temperature: float
    hashes: list[int]  # the prefix hash after each committed token
    min_tokens: int = 0  # its stop tokens cannot be sampled before it has this many (vLLM masks them)
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def budget(self) -> int:
        """Its max_tokens, or what it emitted where it has none."""
        return self.max_tokens or len(self.output)

    def cut(self, sampled: list[int]) -> tuple[list[int], str | None]:
        """What the request keeps of `sampled`: up to its budget, through its first stop token."""
        room = max(self.max_tokens - len(self.output), 0)
        kept = sampled[:room]
        for j, token in enumerate(kept):
            if token in self.stop_ids:
                return kept[: j + 1], "eos"
        return kept, "length" if len(kept) == room else None


def base(hashes: list[int], index: int) -> int | None:
    """The prefix hash before logical index `index` (None: beyond what is known)."""
    return [ROOT, *hashes][index] if 0 <= index <= len(hashes) else None


class Pending:
    """A request's part of a step: its query's columns as fed (tokens, positions, slots written), the slots its
    seq_len reads, the drafts under verification, the target's argmax at its logits rows (its draft places,
    then the bonus place) and the rejection sampler's accepted tokens."""

    def __init__(self, record: dict[str, Any], i: int, request: Request, mine: slice) -> None:
        fed, spec = record["fed"], record["spec"]
        q, rows = slice(*fed["query_start_loc"][i : i + 2]), spec["target_logits_indices"][mine]
        self.request, self.start, self.sampled = request, q.start, record["sampled"][i]
        self.tokens, self.positions, self.writes = fed["input_ids"][q], fed["positions"][q], fed["slot_mapping"][q]
        self.reads = block_slots(fed["block_table"][i], fed["seq_lens"][i], record["block_size"])
        self.drafts = spec["draft_token_ids"][mine]
        self.choices = [record["argmax"][j] for j in [*rows, spec["bonus_logits_indices"][i]]]

    @property
    def committed(self) -> int:  # before the step, as vLLM declares it: its seq_len less its drafts
        return len(self.reads) - len(self.drafts)

    @property
    def chunk(self) -> bool:  # a prefill chunk short of the prompt's end: no row, no drafts said
        return len(self.reads) < len(self.request.prompt)

    @property
    def attends(self) -> tuple[int, list[int]]:
        """n, and what its draft calls attend in logical order: its n committed tokens, then its drafts."""
        n, hashes = self.committed, self.request.hashes
        return n, hashes[:n] + prefixes(self.drafts, base(hashes, n))

    def segment(self) -> Segment:
        """Its `BatchMap` segment (where vLLM's counts disagree, its drafts not said: the row shows both)."""
        d, n = len(self.drafts), len(self.tokens)
        said = {"positions": tuple(self.positions), "writes": tuple(self.writes), "reads": tuple(self.reads)}
        drafts = None if self.chunk or d >= n else d
        return Segment(
            self.request.seq, 0, self.start, n, drafts=drafts, chunk=self.chunk, request=self.request.req_id, **said
        )

    def row(self, r: int, drafted: dict[str, Any], target: SlotLedger) -> RowRecord:
        """The trace row, and the request's tokens committed."""
        request, n = self.request, self.committed
        query = slice(max(len(self.tokens) - len(self.drafts) - 1, 0), len(self.tokens))  # pending + drafts
        emitted, reason = request.cut(self.sampled)
        context, accepted, writes = n - 1, len(self.sampled) - 1, self.writes[query]
        bad = target.bad(request.req_id, self.reads[:context], request.hashes[:context], stable=context)
        own = self.reads[context:][: len(writes)]  # the slots its query tokens' KV belongs in
        elsewhere = np.flatnonzero(np.array(writes[: len(own)]) != np.array(own))
        row = RowRecord(
            row=r,
            seq_id=request.seq,
            committed_before=n,
            left_pad=0,
            left_pad_after=None if reason else 0,
            pending_token=self.tokens[query][0],
            draft_tokens=self.drafts,
            target_tokens=self.choices,
            accepted=accepted,
            bonus=emitted[accepted] if len(emitted) == accepted + 1 else None,
            emitted=emitted,
            write_seq=request.seq,
            position_ids=self.positions[query],
            mask_rle=join_runs(runs(context, bad), runs(len(self.tokens[query]), elsewhere)),
            kv_len=context - len(bad),
            kv_len_expected=n - 1,
            finished=reason is not None,
            finish_reason=reason,
            **drafted,
        )
        request.hashes += prefixes(emitted, base(request.hashes, len(request.hashes)))
        request.output += emitted
        request.finish_reason = reason
        return row


@dataclass
class Assembly:
    """What the records say: requests in run order, trace steps, maps (on request), notes."""

    engine: dict[str, Any]  # the models and the method
    requests: list[Request] = field(default_factory=list)
    maps: list[BatchMap] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    k: int = 0  # the most drafts any request was given
    notes: list[str] = field(default_factory=list)
    unreadable: dict[str, Any] = field(default_factory=dict)  # {step, why} where the metadata first stops saying


def assemble(records: list[dict[str, Any]], maps: bool = False) -> Assembly:
    """Replay the records into trace steps, and into `BatchMap`s where `maps` (the trace needs none)."""
    out = Assembly(engine=records[0]["engine"])
    method = out.engine["method"]
    if method not in PROPOSERS:  # a head: its draft calls are not read
        out.notes.append(f"{method}: {HEAD}")
        records = [{**record, "draft_calls": []} for record in records]
    by_id: dict[str, Request] = {}
    target, draft = SlotLedger(), SlotLedger()
    drafting = NO_DRAFTS  # the previous record, where its draft calls drafted this step's drafts
    for record in records:
        for new in record["new"]:
            by_id[new["req_id"]] = request = Request(len(out.requests), hashes=prefixes(new["prompt"]), **new)
            out.requests.append(request)
        why = _unreadable(record)
        if why is None:
            # Every write of the step is in the ledger before any read is judged: a forward writes its KV
            # before its attention reads it, and another request's write in this forward counts too.
            pending = _pending(record, by_id, target, draft)
            live = [p for p in pending if not p.chunk]
            drafted = _draft_calls(drafting, draft, by_id, {p.request.req_id: p.attends for p in live if p.drafts})
            rows = [p.row(r, drafted.get(p.request.req_id, {}), target) for r, p in enumerate(live)]
            out.k = max([out.k, *(len(r.draft_tokens) for r in rows)])
            if rows:  # not a step of prefill chunks only
                cache_len = max(sum(c for _, c in r.mask_rle) - len(r.draft_tokens) - 1 for r in rows)
                query_len = max(len(r.draft_tokens) + 1 for r in rows)
                out.steps.append(StepRecord(record["step"], 0, cache_len, query_len, None, 0.0, 0.0, 0.0, 0.0, rows))
            drafting = record
        else:
            out.unreadable = out.unreadable or {"step": record["step"], "why": why}
            pending, drafting = [], NO_DRAFTS
        if maps:  # an unreadable step's map: no segments, and why
            out.maps.append(BatchMap(tuple(p.segment() for p in pending), "vllm", why))
    return out


def _unreadable(record: dict[str, Any]) -> str | None:
    """Why a runner step cannot be read (None: it can)."""
    if record["kv_groups"] != 1:
        return f"{record['kv_groups']} KV cache groups (one block table per group): only one is read"
    if "sampled" not in record:
        return "the step's sampler output was not seen"
    return _unread(record["fed"])  # capture's NO_FORWARD until the target's forward is seen


def _unread(fed: dict[str, Any]) -> str | None:
    """Why a forward's record (the target's, a draft call's) says nothing: capture's reason, or no ids fed."""
    if "unreadable" in fed:
        return fed["unreadable"]
    if fed["input_ids"] is None or fed["positions"] is None:  # capture records None for either
        return "the forward was fed embeddings or no positions"
    return None


def _pending(record: dict[str, Any], by_id: dict[str, Request], target: SlotLedger, draft: SlotLedger) -> list[Pending]:
    """Each request's part of the step; its writes go to the target's ledger (a prefix-cache hit's to both)."""
    counts, new = record["spec"]["num_draft_tokens"], {r["req_id"] for r in record["new"]}
    pending = []
    for i, (req_id, end) in enumerate(zip(record["req_ids"], accumulate(counts))):
        p = Pending(record, i, by_id[req_id], slice(end - counts[i], end))
        computed, hashes = len(p.reads) - len(p.tokens), p.request.hashes  # KV an earlier step (or the cache) holds
        if req_id in new:  # a prefix-cache hit on its first step (computed 0: none, nothing adopted)
            target.adopt(p.reads[:computed], hashes[:computed])
            draft.adopt(p.reads[:computed], hashes[:computed])
        target.write(p.writes, p.positions, base(hashes, computed), p.tokens)
        pending.append(p)
    return pending


def _draft_calls(
    drafting: dict[str, Any], ledger: SlotLedger, by_id: dict[str, Request], wanted: dict[str, tuple[int, list[int]]]
) -> dict[str, dict[str, Any]]:
    """Per request in `wanted` (`Pending.attends`), per draft call j of the step before: its last real token's
    position, and how many of the n - 1 + j slots before it hold what it attends (none if a call is unread)."""
    calls = drafting["draft_calls"]
    if any(_unread(call) for call in calls):
        return {}
    req_ids, bs = drafting["req_ids"], drafting["block_size"]
    found = defaultdict(lambda: {"draft_position_ids": [], "draft_kv_lens": []})  # a request's, once judged
    judged = wanted.keys() & set(req_ids)  # drafts this step, drafted by the calls of the step before
    for c, call in enumerate(calls):
        qsl = call["query_start_loc"]
        queries = [slice(a, b) for a, b in zip(qsl, qsl[1:])]
        for req_id, q in zip(req_ids, queries):  # the whole call writes, then reads
            positions = call["positions"][q]
            _, hashes = wanted.get(req_id, (0, by_id[req_id].hashes))  # drafted tokens chain on its drafts
            start = base(hashes, positions[0]) if positions else None
            ledger.write(call["slot_mapping"][q], positions, start, call["input_ids"][q])
        for req_id in judged:
            n, hashes = wanted[req_id]
            # Until its last draft's call. A request whose committed length vLLM overstated (seq_lens past
            # the tokens it has) has no call to judge: its row then carries no draft-call fields, not a crash.
            if c < len(hashes) - n:
                j, want, fields = req_ids.index(req_id), n - 1 + c, found[req_id]
                fed = reversed(list(zip(call["positions"][queries[j]], call["slot_mapping"][queries[j]])))
                fields["draft_position_ids"].append(next((p for p, slot in fed if slot >= 0), -1))  # padding: slot -1
                reads = block_slots(call["block_table"][j], want, bs)
                fields["draft_kv_lens"].append(want - len(ledger.bad(req_id, reads, hashes[:want], stable=n - 1)))
    for req_id, fields in found.items():
        fields.update(draft_kv_len=fields["draft_kv_lens"][0], draft_kv_len_expected=wanted[req_id][0] - 1)
    return dict(found)
