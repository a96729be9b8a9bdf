"""Runner records -> one `BatchMap` and one trace step per runner step, from what vLLM declared.

A runner step verifies the drafts proposed at the end of the step before, then proposes the next
ones; a trace step (specviz's) is the draft that proposed a row's drafts plus the verify of them.
So the draft calls a record carries are the next step's rows' drafting (`draft_position_ids`,
`draft_kv_lens`), and step 0, the prefill, has no drafts. Per request of a step:

- its `Segment`: query tokens `query_start_loc[i]:[i+1]`, positions and input ids as fed, `writes`
  = slot_mapping, `reads` = its block table's slots up to `seq_lens[i]`, drafts from the
  `SpecDecodeMetadata`; a prefill segment that ends short of its prompt is a `chunk` (no row);
- its row: committed before = seq_len - drafts (declared), the pending token and query positions
  as fed, the target's argmax at its logits rows, accepted = sampled tokens - 1 (the rejection
  sampler's count), emitted = the sampled tokens cut where the request ends (max_tokens, a stop
  token), the mask = which attended slots hold the request's committed tokens (`slots.SlotLedger`)
  then whether each query token's KV went to its own slot.
Nothing is taken from the history of token chains: every number is a field vLLM filled in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    slots: list[int] = field(default_factory=list)  # the slots of that table, up to its last seq_len

    def __post_init__(self) -> None:
        self.hashes = prefixes(self.prompt)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def commit(self, tokens: list[int], reason: str | None) -> None:
        self.hashes += prefixes(tokens, self.hashes[-1] if self.hashes else ROOT)
        self.output += tokens
        self.finish_reason = reason

    def base(self, index: int, hashes: list[int] | None = None) -> int | None:
        """The prefix hash before logical index `index` (None: beyond what is known)."""
        hashes = self.hashes if hashes is None else hashes
        if index == 0:
            return ROOT
        return hashes[index - 1] if 0 < index <= len(hashes) else None

    def reads(self, table: list[int], length: int, block_size: int) -> list[int]:
        """The slots of logical indices 0..length-1 under `table`, from the last ones read where the
        table is theirs (block tables only grow while a request lives)."""
        if table == self.table and length <= len(self.slots):
            return self.slots[:length]
        same = table[: len(self.table)] == self.table
        self.slots = block_slots(table, length, block_size, self.slots if same else None)
        self.table = table
        return self.slots

    def cut(self, sampled: list[int]) -> tuple[list[int], str | None]:
        """What the request keeps of `sampled`: up to its budget, through its first stop token."""
        kept: list[int] = []
        for token in sampled:
            if self.max_tokens is not None and len(self.output) + len(kept) >= self.max_tokens:
                return kept, "length"
            kept.append(token)
            if token in self.stop_ids:
                return kept, "eos"
        if self.max_tokens is not None and len(self.output) + len(kept) >= self.max_tokens:
            return kept, "length"
        return kept, None


@dataclass
class Assembly:
    """What the records say: requests in run order, a map and a trace step per runner step."""

    requests: list[Request] = field(default_factory=list)
    maps: list[BatchMap] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    k: int = 0  # the most drafts any request was given
    notes: list[str] = field(default_factory=list)
    unreadable: tuple[int, str] | None = None  # (step, why) from where the metadata stops saying


# Proposers whose draft calls follow specviz's convention (call j feeds token n - 1 + j at that
# position). EAGLE-style heads feed token p + 1 with the target's hidden state p at position p:
# their draft calls are not judged (the rows record no draft positions or draft slots).
TOKEN_DRAFTERS = ("draft_model",)


def assemble(records: list[dict[str, Any]], maps: bool = False) -> Assembly:
    """Replay the records in step order into trace steps, and into one `BatchMap` per runner step
    where `maps` (the trace needs none; building them costs a validation per slot)."""
    out = Assembly()
    method = (records[0].get("engine") or {}).get("method") if records else None
    if method is not None and method not in TOKEN_DRAFTERS and method != "ngram":
        out.notes.append(
            f"{method}: its draft calls feed token p + 1 at position p; the draft-side checks do not apply"
        )
    by_id: dict[str, Request] = {}
    target, draft = SlotLedger(), SlotLedger()
    drafting: dict[str, Any] | None = None  # the previous record: its draft calls drafted this step
    for record in records:
        for new in record["new"]:
            by_id[new["req_id"]] = request = _request(new, len(out.requests))
            out.requests.append(request)
        why = _unreadable(record)
        if why is not None:
            out.unreadable = out.unreadable or (record["step"], why)
            if maps:
                out.maps.append(BatchMap.unread("vllm", why))
            drafting = None
            continue
        bmap, rows = _step(record, by_id, target, draft, drafting, maps)
        if bmap is not None:
            out.maps.append(bmap)
        out.k = max([out.k, *(len(r.draft_tokens) for r in rows)])
        if rows:
            out.steps.append(_step_record(record["step"], rows))
        drafting = record if method in TOKEN_DRAFTERS else None
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
    if fed["input_ids"] is None or fed["positions"] is None:
        return "the target was fed embeddings or no positions"
    return None


def _step(
    record: dict[str, Any],
    by_id: dict[str, Request],
    target: SlotLedger,
    draft: SlotLedger,
    drafting: dict[str, Any] | None,
    maps: bool,
) -> tuple[BatchMap | None, list[RowRecord]]:
    fed, spec, bs = record["fed"], record.get("spec"), record["block_size"]
    qsl, seq_lens = fed["query_start_loc"], fed["seq_lens"]
    req_ids = record["req_ids"]
    num_drafts = spec["num_draft_tokens"] if spec else [0] * len(req_ids)
    segments, pending_rows = [], []
    new = {r["req_id"] for r in record["new"]}
    for i, req_id in enumerate(req_ids):
        request = by_id[req_id]
        a, b = qsl[i], qsl[i + 1]
        tokens, positions, writes = fed["input_ids"][a:b], fed["positions"][a:b], fed["slot_mapping"][a:b]
        reads = request.reads(fed["block_table"][i], seq_lens[i], bs)
        chunk = seq_lens[i] < len(request.prompt)
        d = 0 if chunk else num_drafts[i]
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
        target.write(writes, positions, request.base(computed), tokens)
        if not chunk:
            pending_rows.append((i, request, tokens, positions, writes, reads, d))
    # Every write of the step is in the ledger before any read is judged: a forward writes its KV
    # before its attention reads it, and another request's write in this forward counts too.
    wanted = {}
    for i, request, _, _, _, reads, d in pending_rows:
        if d:  # its n committed tokens, then its drafts: what its draft calls attend, in logical order
            n = len(reads) - d
            drafts = _drafts_of(record, i, d)
            wanted[request.req_id] = (n, request.hashes[:n] + prefixes(drafts, request.base(n) or ROOT))
    drafted = _draft_calls(drafting, draft, by_id, wanted)
    rows = []
    for args in pending_rows:
        rows.append(_row(len(rows), record, drafted.get(args[1].req_id), target, *args))
    for row, (_, request, *_rest) in zip(rows, pending_rows):
        request.commit(row.emitted, row.finish_reason)
    return (BatchMap(tuple(segments), "vllm") if maps else None), rows


def _row(
    r: int,
    record: dict[str, Any],
    drafted: tuple[list[int], list[int]] | None,
    target: SlotLedger,
    i: int,
    request: Request,
    tokens: list[int],
    positions: list[int],
    writes: list[int],
    reads: list[int],
    d: int,
) -> RowRecord:
    seq_len = len(reads)
    n = seq_len - d  # committed before the step, as vLLM declares it (its seq_len less the drafts)
    query = slice(max(len(tokens) - d - 1, 0), len(tokens))  # the pending token and the drafts, as fed
    targets = _choices(record, i, d)
    sampled = [t for t in record["sampled"][i] if t >= 0]
    emitted, reason = request.cut(sampled)
    context = n - 1
    bad = target.bad(request.req_id, reads[:context], request.hashes[:context], stable=context)
    elsewhere = [q for q, (w, s) in enumerate(zip(writes[query], reads[context:])) if w != s]
    accepted = len(sampled) - 1
    return RowRecord(
        row=r,
        seq_id=request.seq,
        committed_before=n,
        left_pad=0,
        left_pad_after=None if reason else 0,
        pending_token=tokens[query][0],
        draft_tokens=_drafts_of(record, i, d),
        target_tokens=targets,
        accepted=accepted,
        bonus=emitted[accepted] if len(emitted) == accepted + 1 else None,
        emitted=emitted,
        write_seq=request.seq,
        position_ids=positions[query],
        mask_rle=join_runs(runs(context, bad), runs(len(tokens[query]), elsewhere)),
        kv_len=context - len(bad),
        kv_len_expected=n - 1,
        draft_kv_len=drafted[1][0] if drafted else None,
        draft_kv_len_expected=n - 1 if drafted else None,
        finished=reason is not None,
        finish_reason=reason,
        draft_position_ids=drafted[0] if drafted else None,
        draft_kv_lens=drafted[1] if drafted else None,
    )


def _drafts_of(record: dict[str, Any], i: int, d: int) -> list[int]:
    """Request i's drafts as the SpecDecodeMetadata holds them (what the rejection sampler compares)."""
    if not d:
        return []
    spec = record["spec"]
    end = sum(spec["num_draft_tokens"][: i + 1])
    return spec["draft_token_ids"][end - d : end]


def _choices(record: dict[str, Any], i: int, d: int) -> list[int]:
    """The target's argmax at request i's logits rows: its d draft places, then the bonus place."""
    spec, argmax = record.get("spec"), record["argmax"]
    if spec is None:
        return [argmax[i]]
    end = sum(spec["num_draft_tokens"][: i + 1])
    rows = spec["target_logits_indices"][end - d : end] + [spec["bonus_logits_indices"][i]]
    return [argmax[row] for row in rows]


def _draft_calls(
    drafting: dict[str, Any] | None,
    ledger: SlotLedger,
    by_id: dict[str, Request],
    wanted: dict[str, tuple[int, list[int]]],
) -> dict[str, tuple[list[int], list[int]]]:
    """Per request with drafts this step (`wanted`: its committed count n and the prefix hashes of its
    committed tokens then its drafts), each draft call of the step before that proposed them: the
    position of its last real token (padding has slot -1), and how many of the n - 1 + j slots
    before it hold what it attends them for. Empty where no draft model ran (n-gram)."""
    calls = (drafting or {}).get("draft_calls") or []
    if not calls or any("unreadable" in call for call in calls):
        return {}
    req_ids, bs = drafting["req_ids"], drafting["block_size"]
    found: dict[str, tuple[list[int], list[int]]] = {r: ([], []) for r in wanted if r in req_ids}
    for call in calls:
        qsl = call["query_start_loc"]
        for j, req_id in enumerate(req_ids[: len(qsl) - 1]):  # the whole call writes, then reads
            a, b = qsl[j], qsl[j + 1]
            positions = call["positions"][a:b]
            request = by_id[req_id]
            base = request.base(positions[0], wanted[req_id][1] if req_id in wanted else None) if positions else None
            ledger.write(call["slot_mapping"][a:b], positions, base, call["input_ids"][a:b])
        for req_id, (positions, attended) in found.items():
            n, hashes = wanted[req_id]
            if len(positions) == len(hashes) - n:
                continue
            j = req_ids.index(req_id)
            fed = zip(call["positions"][qsl[j] : qsl[j + 1]], call["slot_mapping"][qsl[j] : qsl[j + 1]])
            real = [p for p, slot in fed if slot >= 0]
            want = n - 1 + len(positions)
            reads = by_id[req_id].reads(call["block_table"][j], want, bs)
            positions.append(real[-1] if real else -1)
            attended.append(want - len(ledger.bad(req_id, reads[:want], hashes[:want], stable=n - 1)))
    return found


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
