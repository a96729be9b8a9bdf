"""Runner records -> one `BatchMap` and one trace step per runner step, from what vLLM declared
(docs/vllm.md section 3 lists each field's source).

A runner step verifies the drafts proposed at the end of the step before, then proposes the next
ones; a trace step is the draft that proposed a row's drafts plus their verify. So a record's draft
calls are the next step's rows' drafting (`draft_position_ids`, `draft_kv_lens`), and step 0, the
prefill, has no drafts. A prefill segment that ends short of its prompt is a `chunk`: no row. Every
number is a field vLLM filled in, none taken from the history of token chains; the mask says which
attended slots hold the request's own committed tokens (`slots.SlotLedger`), then whether each
query token's KV went to its own slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from specviz.trace.schema import RowRecord, StepRecord
from specviz.watch.map import BatchMap, Segment
from specviz.watch.vllm.slots import ROOT, SlotLedger, block_slots, join_runs, prefixes, runs


@dataclass
class Request:
    """One request as the scheduler handed it over, and what the run wrote to it."""

    seq: int  # its index in the run: the order vLLM first scheduled it (the prompt's, for one generate call)
    req_id: str
    prompt: list[int]
    max_tokens: int | None
    stop_ids: frozenset[int]
    temperature: float
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    hashes: list[int] = field(default_factory=list)  # the prefix hash after each committed token
    table: list[int] = field(default_factory=list)  # its block table when last read
    slots: list[int] = field(default_factory=list)  # the slots of that table, as far as they were read

    def __post_init__(self) -> None:
        self.hashes = prefixes(self.prompt)

    @property
    def budget(self) -> int:
        """Its max_tokens, or what it emitted where it has none (a request ended by length holds
        exactly max_tokens)."""
        return self.max_tokens or len(self.output)

    def commit(self, tokens: list[int], reason: str | None) -> None:
        self.hashes += prefixes(tokens, base(self.hashes, len(self.hashes)))
        self.output += tokens
        self.finish_reason = reason

    def reads(self, table: list[int], length: int, block_size: int) -> list[int]:
        """The slots of logical indices 0..length-1 under `table`, extending the last ones read where
        the table extends theirs (block tables only grow while a request lives)."""
        known = self.slots if table[: len(self.table)] == self.table else []
        self.slots = block_slots(table, max(length, len(known)), block_size, known)
        self.table = table
        return self.slots[:length]

    def cut(self, sampled: list[int]) -> tuple[list[int], str | None]:
        """What the request keeps of `sampled`: up to its budget, through its first stop token."""
        # No max_tokens: room past what was sampled, never filled.
        room = len(sampled) + 1 if self.max_tokens is None else max(self.max_tokens - len(self.output), 0)
        for j, token in enumerate(sampled[:room]):
            if token in self.stop_ids:
                return sampled[: j + 1], "eos"
        kept = sampled[:room]
        return kept, "length" if len(kept) == room else None


def base(hashes: list[int], index: int) -> int | None:
    """The prefix hash before logical index `index` of a request with these prefix hashes (None: beyond
    what is known)."""
    return hashes[index - 1] if 0 < index <= len(hashes) else (ROOT if index == 0 else None)


@dataclass
class Pending:
    """A request's row in a step, before the step's draft calls are judged: what was fed and read."""

    request: Request
    tokens: list[int]  # its query tokens as fed, then their positions and slots
    positions: list[int]
    writes: list[int]
    reads: list[int]
    drafts: list[int]  # under verification, as the SpecDecodeMetadata holds them
    choices: list[int]  # the target's argmax at its logits rows: its draft places, then the bonus place
    sampled: list[int]  # the rejection sampler's tokens, rejected places -1

    @property
    def committed(self) -> int:  # before the step, as vLLM declares it: its seq_len less its drafts
        return len(self.reads) - len(self.drafts)


@dataclass
class Assembly:
    """What the records say: requests in run order, a map and a trace step per runner step."""

    engine: dict[str, Any] = field(default_factory=dict)  # the models and the method, from the first step
    requests: list[Request] = field(default_factory=list)
    maps: list[BatchMap] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    k: int = 0  # the most drafts any request was given
    notes: list[str] = field(default_factory=list)
    unreadable: dict[str, Any] = field(default_factory=dict)  # {step, why} where the metadata first stops saying


# Proposers whose draft calls follow specviz's convention (call j feeds token n - 1 + j at that
# position). EAGLE-style heads feed token p + 1 with the target's hidden state p at position p:
# their draft calls are not judged (the rows record no draft positions or draft slots).
TOKEN_DRAFTERS = ("draft_model",)
NOT_HEADS = (None, "ngram", *TOKEN_DRAFTERS)  # no speculation, n-gram lookup, a draft model


def assemble(records: list[dict[str, Any]], maps: bool = False) -> Assembly:
    """Replay the records in step order into trace steps, and into one `BatchMap` per runner step
    where `maps` (the trace needs none; building them costs a validation per slot)."""
    out = Assembly(engine=next(iter(records), {}).get("engine") or {})
    method = out.engine.get("method")
    if method not in NOT_HEADS:
        out.notes.append(
            f"{method}: its draft calls feed token p + 1 at position p; the draft-side checks do not apply"
        )
    by_id: dict[str, Request] = {}
    target, draft = SlotLedger(), SlotLedger()
    drafting: dict[str, Any] = {}  # the previous record, where its draft calls drafted this step's drafts
    for record in records:
        for new in record["new"]:
            by_id[new["req_id"]] = request = _request(new, len(out.requests))
            out.requests.append(request)
        why = _unreadable(record)
        if why is None:
            bmap, rows = _step(record, by_id, target, draft, drafting, maps)
            out.k = max([out.k, *(len(r.draft_tokens) for r in rows)])
            if rows:
                out.steps.append(_step_record(record["step"], rows))
            drafting = record if method in TOKEN_DRAFTERS else {}
        else:
            out.unreadable = out.unreadable or {"step": record["step"], "why": why}
            bmap, drafting = BatchMap.unread("vllm", why), {}
        if maps:
            out.maps.append(bmap)
    return out


def _request(new: dict[str, Any], seq: int) -> Request:
    stop = frozenset(new["stop_ids"])
    return Request(seq, new["req_id"], new["prompt"], new["max_tokens"], stop, new["temperature"])


def _unreadable(record: dict[str, Any]) -> str | None:
    fed = record.get("fed")
    if fed is None:
        return "no target forward was seen in this runner step"
    if "unreadable" in fed:
        return fed["unreadable"]
    if record["kv_groups"] != 1:
        return f"{record['kv_groups']} KV cache groups (one block table per group): only one is read"
    if "sampled" not in record:
        return "the step's sampler output was not seen"
    if _fed_no_ids(fed):
        return "the target was fed embeddings or no positions"
    return None


def _fed_no_ids(fed: dict[str, Any]) -> bool:
    """A forward fed embeddings or no positions (capture records None for either): nothing to read."""
    return fed["input_ids"] is None or fed["positions"] is None


def _no_spec(batch: int) -> dict[str, Any]:
    """The SpecDecodeMetadata of a step without drafts: request i's one logits row is row i."""
    return {
        "num_draft_tokens": [0] * batch,
        "draft_token_ids": [],
        "target_logits_indices": [],
        "bonus_logits_indices": list(range(batch)),
    }


def _step(
    record: dict[str, Any],
    by_id: dict[str, Request],
    target: SlotLedger,
    draft: SlotLedger,
    drafting: dict[str, Any],
    maps: bool,
) -> tuple[BatchMap | None, list[RowRecord]]:
    fed, bs, req_ids, argmax = record["fed"], record["block_size"], record["req_ids"], record["argmax"]
    qsl, seq_lens = fed["query_start_loc"], fed["seq_lens"]
    spec = record.get("spec") or _no_spec(len(req_ids))
    ends = list(accumulate(spec["num_draft_tokens"]))  # request i's drafts end there in the flat lists
    segments, pending = [], []
    new = {r["req_id"] for r in record["new"]}
    for i, req_id in enumerate(req_ids):
        request = by_id[req_id]
        a, b = qsl[i], qsl[i + 1]
        tokens, positions, writes = fed["input_ids"][a:b], fed["positions"][a:b], fed["slot_mapping"][a:b]
        reads = request.reads(fed["block_table"][i], seq_lens[i], bs)
        chunk = seq_lens[i] < len(request.prompt)
        d = spec["num_draft_tokens"][i]  # read only where not a chunk (a chunk has no row and says no drafts)
        if maps:
            segments.append(
                Segment(
                    request.seq,
                    0,
                    a,
                    b - a,
                    # vLLM's two counts disagree when a segment is shorter than its drafts + 1: the
                    # map says "not said" and the row shows both (its drafts, its fed positions).
                    drafts=None if chunk or d >= b - a else d,
                    chunk=chunk,
                    positions=tuple(positions),
                    writes=tuple(writes),
                    reads=tuple(reads),
                    request=req_id,
                )
            )
        computed = seq_lens[i] - (b - a)  # declared: tokens whose KV an earlier step (or the cache) holds
        if req_id in new and computed > 0:  # a prefix-cache hit on its first step
            target.adopt(reads[:computed], request.hashes[:computed])
            draft.adopt(reads[:computed], request.hashes[:computed])
        target.write(writes, positions, base(request.hashes, computed), tokens)
        if not chunk:
            mine = slice(ends[i] - d, ends[i])
            rows = spec["target_logits_indices"][mine] + [spec["bonus_logits_indices"][i]]
            choices = [argmax[row] for row in rows]
            drafts = spec["draft_token_ids"][mine]
            pending.append(Pending(request, tokens, positions, writes, reads, drafts, choices, record["sampled"][i]))
    # Every write of the step is in the ledger before any read is judged: a forward writes its KV
    # before its attention reads it, and another request's write in this forward counts too.
    # What a request's draft calls attend, in logical order: its n committed tokens, then its drafts.
    wanted = {
        p.request.req_id: (p.committed, p.request.hashes[: p.committed] + _chained(p)) for p in pending if p.drafts
    }
    drafted = _draft_calls(drafting, draft, by_id, wanted)
    rows = [_row(r, p, drafted.get(p.request.req_id, {}), target) for r, p in enumerate(pending)]
    for row, p in zip(rows, pending):
        p.request.commit(row.emitted, row.finish_reason)
    return (BatchMap(tuple(segments), "vllm") if maps else None), rows


def _chained(p: Pending) -> list[int]:
    """The prefix hashes of a request's drafts, chained on its committed tokens."""
    return prefixes(p.drafts, base(p.request.hashes, p.committed) or ROOT)


def _row(r: int, p: Pending, drafted: dict[str, Any], target: SlotLedger) -> RowRecord:
    request, n = p.request, p.committed
    query = slice(max(len(p.tokens) - len(p.drafts) - 1, 0), len(p.tokens))  # the pending token and the drafts
    sampled = [t for t in p.sampled if t >= 0]
    emitted, reason = request.cut(sampled)
    context = n - 1
    bad = target.bad(request.req_id, p.reads[:context], request.hashes[:context], stable=context)
    elsewhere = [q for q, (w, s) in enumerate(zip(p.writes[query], p.reads[context:])) if w != s]
    accepted = len(sampled) - 1
    return RowRecord(
        row=r,
        seq_id=request.seq,
        committed_before=n,
        left_pad=0,
        left_pad_after=None if reason else 0,
        pending_token=p.tokens[query][0],
        draft_tokens=p.drafts,
        target_tokens=p.choices,
        accepted=accepted,
        bonus=emitted[accepted] if len(emitted) == accepted + 1 else None,
        emitted=emitted,
        write_seq=request.seq,
        position_ids=p.positions[query],
        mask_rle=join_runs(runs(context, bad), runs(len(p.tokens[query]), elsewhere)),
        kv_len=context - len(bad),
        kv_len_expected=n - 1,
        finished=reason is not None,
        finish_reason=reason,
        **drafted,
    )


def _draft_calls(
    drafting: dict[str, Any],
    ledger: SlotLedger,
    by_id: dict[str, Request],
    wanted: dict[str, tuple[int, list[int]]],
) -> dict[str, dict[str, Any]]:
    """Per request with drafts this step (`wanted`: its committed count n and the prefix hashes of its
    committed tokens then its drafts), its row's draft-side fields from each draft call j of the
    step before: the position of its last real token (padding has slot -1), and how many of the
    n - 1 + j slots before it hold what it attends them for. Empty where no draft model ran."""
    calls = drafting.get("draft_calls", [])
    # A draft call whose metadata was unreadable, or that was fed embeddings or no positions (an
    # EAGLE-like drafter may be): no draft-side fields, as where no draft model ran, never a crash.
    if not calls or any("unreadable" in call or _fed_no_ids(call) for call in calls):
        return {}
    req_ids, bs = drafting["req_ids"], drafting["block_size"]
    found: dict[str, tuple[list[int], list[int]]] = {r: ([], []) for r in wanted if r in req_ids}
    for call in calls:
        qsl = call["query_start_loc"]
        for j, req_id in enumerate(req_ids[: len(qsl) - 1]):  # the whole call writes, then reads
            a, b = qsl[j], qsl[j + 1]
            positions = call["positions"][a:b]
            _, hashes = wanted.get(req_id, (0, by_id[req_id].hashes))  # drafted tokens chain on its drafts
            start = base(hashes, positions[0]) if positions else None
            ledger.write(call["slot_mapping"][a:b], positions, start, call["input_ids"][a:b])
        for req_id, (positions, attended) in found.items():
            n, hashes = wanted[req_id]
            if len(positions) == len(hashes) - n:  # its last draft's call is judged
                continue
            j = req_ids.index(req_id)
            fed = list(zip(call["positions"][qsl[j] : qsl[j + 1]], call["slot_mapping"][qsl[j] : qsl[j + 1]]))
            want = n - 1 + len(positions)
            reads = by_id[req_id].reads(call["block_table"][j], want, bs)
            positions.append(next((p for p, slot in reversed(fed) if slot >= 0), -1))  # its last real token's
            attended.append(want - len(ledger.bad(req_id, reads[:want], hashes[:want], stable=n - 1)))
    return {
        req_id: {
            "draft_kv_len": attended[0],
            "draft_kv_len_expected": wanted[req_id][0] - 1,
            "draft_position_ids": positions,
            "draft_kv_lens": attended,
        }
        for req_id, (positions, attended) in found.items()
    }


def _step_record(step: int, rows: list[RowRecord]) -> StepRecord:
    widths = [sum(c for _, c in r.mask_rle) for r in rows]
    query = max(len(r.draft_tokens) + 1 for r in rows)
    return StepRecord(
        step=step,
        batch_id=0,
        cache_len=max(w - len(r.draft_tokens) - 1 for w, r in zip(widths, rows)),
        query_len=query,
        grouped=None,
        draft_ms=0.0,
        verify_ms=0.0,
        align_ms=0.0,
        total_ms=0.0,
        rows=rows,
    )
