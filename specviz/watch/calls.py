"""Reading one row of one materialized captured call: its pending slot and draft chain (`RowQuery`,
`CallReader`), the argmax at a slot, and all a verify row shows before any emission is credited to
it (`read_step`, `RowRead`): its nodes, the target's choices, its mask row, its drafts' feeds. What a
row feeds and attends is its `view.View`'s; this module reads through it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from itertools import compress, pairwise

from specviz.watch.map import Segment
from specviz.watch.record import CallRecord


@dataclass(frozen=True)
class RowQuery:
    """One row of one target call as read: where its pending token sits, and its d drafts."""

    pending: int  # query slot of the pending token
    drafts: int  # d: draft tokens after it
    chain: tuple[tuple[int, int], ...]  # (draft call index, draft row) per draft, in order


@dataclass
class RowRead:
    """One row of a verify call as the call shows it, before any emission is credited to it
    (`read_step`). A chain is read as a tree whose node i hangs off node i - 1, so one path rule
    (`tree.consistent`, `tree.accepted_path`) reads both."""

    row: int
    seq_id: int
    rq: RowQuery
    nodes: list[int]  # [d + 1]: the pending token, then the drafts (a tree's nodes)
    targets: list[int]  # [d + 1]: the target's argmax at each node's slot ([]: not kept)
    parents: list[int]  # [d + 1]: each node's parent (-1: the root)
    tree: bool  # a tree row (declared or read from its mask), else a chain
    passive: bool  # idle, a prefill chunk or a newcomer's prefill riding along: a step only if credited
    runs: list[list[int]]  # the pending token's mask row (`View.mask_row`, a tree's `View.tree_row`)
    context: int  # the slots it attends before the pending token (-1: not read)
    causal: bool | None  # the query block causal (None: not said, or a tree)
    attends: list[list[int]] | None  # a tree row's nodes: the nodes each attends
    cache: int  # slots in its cache before the call
    positions: list[int]  # [d + 1]: the positions its nodes were fed
    draft_positions: list[int]  # per draft call of its chain: the position fed ([]: no chain)
    draft_contexts: list[int]  # per draft call of its chain: the slots it attended (-1: not read)

    @property
    def drafts(self) -> list[int]:
        return self.nodes[1:]


@dataclass
class StepRead:
    """A verify call's rows (`RowRead`) and the draft calls since the target call before it."""

    rows: list[RowRead]
    drafted: list[int]  # the draft calls since the previous target call, latest first
    heads: list[int]  # those of a draft head (its proposals are read from the verify)


def read_step(
    read: CallReader,
    index: int,
    committed: dict[int, list[int]],
    prompts: list[list[int]],
    running: set[int],
    draft_free: bool,
) -> StepRead:
    """Target call `index` read row by row (`read`), each sequence holding its `committed` tokens;
    with no draft model (`draft_free`), drafts nothing else gave are read after those tokens
    (`draft_free_query`). A row is passive where it may produce nothing and be no step of its
    sequence: a finished sequence's row the engine still computes, a static slot fed only padding, a
    prefill chunk said so, or a newcomer's prefill riding in another's step (a sequence not stepped
    yet fed its prompt's next tokens, in a call where some row reads a cache: vLLM mixes them in)."""
    calls, call = read.calls, read.calls[index]
    drafted = draft_calls_before(calls, index)
    cached = any(v.cache for v in call.views)  # else every row of a re-prefill is read
    rows = []
    for r, seq_id in enumerate(call.seq_ids):
        rq = read(index, r)
        if draft_free and not rq.drafts and segment_of(call, r).drafts is None:
            rq = draft_free_query(call, r, committed.get(seq_id, [])) or rq
        passive = (
            seq_id not in running
            or not any(call.views[r].flags)
            or segment_of(call, r).chunk
            or (cached and len(committed[seq_id]) == len(prompts[seq_id]) and _prefills(call, r, prompts[seq_id]))
        )
        rows.append(row_read(calls, index, r, seq_id, rq, passive))
    return StepRead(rows, drafted, [j for j in drafted if calls[j].drafter])


def _prefills(call: CallRecord, row: int, prompt: list[int]) -> bool:
    """Did the row feed the prompt's next tokens after its cache's, short of its end (a decode feeds the last)?"""
    fed, c = attended_ids(call, row), call.views[row].cache  # (a row fed nothing is idle, never asked)
    return c + len(fed) < len(prompt) and fed == prompt[c : c + len(fed)]


def row_read(calls: list[CallRecord], index: int, r: int, seq_id: int, rq: RowQuery, passive: bool) -> RowRead:
    """Row `r` of call `index`, holding `seq_id`, read as `rq` (`read_step` says whether it is `passive`)."""
    call, view = calls[index], calls[index].views[r]
    drafts, targets = row_tokens(call, r, rq)
    runs, context, causal = view.mask_row(rq.pending, rq.drafts + 1)
    tree = call.trees[r]
    if tree is None:  # a chain: node i hangs off node i - 1
        parents, attends = list(range(-1, len(drafts))), None
    else:  # a tree row (schema 3): its own mask reading
        parents = list(tree)
        tree_read = view.tree_row(rq.pending, parents)
        if tree_read is not None:
            runs, context = tree_read
        causal, attends = None, view.node_attends(rq.pending, len(parents))
    # Where the row's draft calls fed it, and the context each attended where its mask was read.
    contexts = [calls[j].views[dr].before(calls[j].last_slots[dr]) for j, dr in rq.chain]
    return RowRead(
        row=r,
        seq_id=seq_id,
        rq=rq,
        nodes=[call.input_ids[r][rq.pending], *drafts],
        targets=targets,
        parents=parents,
        tree=tree is not None,
        passive=passive,
        runs=runs,
        context=context,
        causal=causal,
        attends=attends,
        cache=view.cache,
        positions=list(call.positions[r][rq.pending : rq.pending + rq.drafts + 1]),
        draft_positions=fed_positions(calls, rq.chain),
        draft_contexts=contexts,
    )


def draft_calls_before(calls: list[CallRecord], index: int) -> list[int]:
    """The draft calls since the target call before this one, latest first (a tree's proposals, timed)."""
    before = next((j for j in range(index - 1, -1, -1) if calls[j].role == "target"), -1)
    return list(range(index - 1, before, -1))


_UNSAID = Segment(None, 0, 0, 1)  # what a call with no readable map says of a row: nothing


def segment_of(call: CallRecord, row: int) -> Segment:
    """What the materialized call's map says of the row (`drafts`, `chunk`); nothing without a readable map."""
    return call.map.segments[row] if len(call.map.segments) == call.batch_size else _UNSAID


def argmax_at(call: CallRecord, row: int, slot: int) -> int | None:
    """The model's argmax at query slot `slot` of `row`, if its logits were kept and are its choice."""
    if call.argmax is None or not call.argmax_is_choice:
        return None
    kept = call.argmax[row]
    index = slot - (call.query_len - len(kept))
    return kept[index] if 0 <= index < len(kept) else None


class CallReader:
    """Each target call row's `RowQuery`, read as a sequence (None: the call's own), once: the longest
    run of its draft calls that fed query slots last-d .. last-1 and proposed the next (`_chain_query`);
    drafts the engine said (`segment_of`) fix d. A tree row's nodes end at its last real slot."""

    def __init__(self, calls: list[CallRecord]) -> None:
        self.calls = calls
        # Plain dicts, not `functools.cache` on bound methods: that is a reference cycle holding every
        # call, which only a garbage collection (slow once torch is loaded) frees after close.
        self._reads: dict[tuple[int, int, int | None], RowQuery] = {}  # by (index, row, seq)
        # By (index, row, seq where a draft call declared rows, draft calls): candidates share a chain.
        self._chains: dict[tuple[int, int, int | None, tuple[int, ...]], RowQuery] = {}

    def __call__(self, index: int, row: int, seq: int | None = None) -> RowQuery:
        key = (index, row, seq)
        if key not in self._reads:
            self._reads[key] = self._read_row(index, row, seq, True)
        return self._reads[key]

    def _read_row(self, index: int, row: int, seq: int | None, pass_reprefill: bool) -> RowQuery:
        verify = self.calls[index]
        last, parents = verify.last_slots[row], verify.trees[row]
        if parents is not None:
            return RowQuery(last - len(parents) + 1, len(parents) - 1, ())
        seq = verify.seq_ids[row] if seq is None else seq
        proposals = self._draft_calls(index, seq, pass_reprefill)
        declared = any(self.calls[j].rows is not None for j in proposals)
        key = (index, row, seq if declared else None, proposals)
        # A re-prefill's reading is read afresh: the command may since have said its drafts (`infer.gains`).
        if not pass_reprefill:
            return self._chain_query(*key)
        if key not in self._chains:
            self._chains[key] = self._ahead(key, seq, self._chain_query(*key))
        return self._chains[key]

    def _ahead(self, key: tuple[int, int, int | None, tuple[int, ...]], seq: int, found: RowQuery) -> RowQuery:
        """Drafts proposed one verify ahead (an engine that drafts the next step before this verify, and
        keeps those drafts where the step accepted all): where the chain found since the previous verify
        fed other positions than the query's, the chain of the draft calls before that verify that fed them."""
        index, row, _, proposals = key
        want = list(self.calls[index].positions[row][found.pending : found.pending + found.drafts])
        if not found.chain or fed_positions(self.calls, found.chain) == want:
            return found
        before = next((j for j in range(proposals[0] - 1, -1, -1) if self.calls[j].role == "target"), 0)
        earlier = self._draft_calls(before, seq, False)  # (none before the first target call)
        again = self._chain_query(*key[:3], earlier)
        return again if again.chain and fed_positions(self.calls, again.chain) == want else found

    def _draft_calls(self, index: int, seq: int, pass_reprefill: bool) -> tuple[int, ...]:
        """Draft calls since the sequence's previous target call, passing over once a re-prefill of it
        (a target call with no draft call after it and no drafts in its own query)."""
        found: list[int] = []
        passed = not pass_reprefill
        for j in range(index - 1, -1, -1):
            call = self.calls[j]
            if call.role != "target":
                if call.argmax is not None and not call.drafter:  # a head's proposals are read from the verify
                    found.append(j)
                continue
            if seq in call.seq_ids:
                if found or passed or self._read_row(j, call.seq_ids.index(seq), None, False).drafts:
                    break
                passed = True
        return tuple(found[::-1])

    def _chain_query(self, index: int, row: int, seq: int | None, proposals: tuple[int, ...]) -> RowQuery:
        """The longest chain that fits, else the drafts said (`seq`: None where no draft call declared rows):
        of the runs that fit, the first fed the query's own positions, else the earliest (a position bug)."""
        verify = self.calls[index]
        last, said = verify.last_slots[row], segment_of(verify, row).drafts
        run = verify.views[row].real_run()  # a chain of d needs d + 1 real slots
        reach = min(len(proposals), run - 1)
        if said is None:
            lengths: list[int] | range = range(reach, 0, -1)
            said = 0  # no chain fits: no drafts read
        else:
            said = min(said, last)
            lengths = [said] if 0 < said <= reach else []
        ids, fed, top, size = verify.input_ids[row], verify.positions[row], max(lengths, default=0), verify.batch_size

        @cache  # local, gone on return: each draft row is asked once, however many runs it is a link of
        def links(e: int) -> list[int]:  # the rows of the calls up to proposals[e] that fed last - 1, last - 2, ...
            found: list[int] = []
            for n in range(min(e + 1, top)):  # each fed ids[s] at position fed[s] and proposed ids[s + 1]
                s = last - 1 - n
                hit = self._draft_row(proposals[e - n], seq, row, verify.batch_size, ids[s], ids[s + 1], fed[s])
                if hit is None:
                    break
                found.append(hit)
            return found

        for d in lengths:  # the runs of d calls ending at each e in turn
            ends = range(d - 1, len(proposals))
            runs = [tuple(zip(proposals[e + 1 - d : e + 1], links(e)[d - 1 :: -1])) for e in ends if len(links(e)) >= d]
            own = [run for run in runs if fed_positions(self.calls, run) == list(fed[last - d : last])]
            # None fed its positions (a position bug): its own row of each draft call, where the batch
            # kept its size, before the earliest run (a row fed alike elsewhere is not this one's draft).
            same = [run for run in runs if all((r, self.calls[j].batch_size) == (row, size) for j, r in run)]
            if runs:
                return RowQuery(last - d, d, (own + same + runs)[0])
        if isinstance(lengths, range):  # nothing said, no chain: drafts one call proposed at once
            said = self._proposed_at_once(proposals, ids, last, run - 1)
        return RowQuery(last - said, said, ())

    def _proposed_at_once(self, proposals: tuple[int, ...], ids: list[int], last: int, reach: int) -> int:
        """The most drafts (two or more) that one draft call proposed in one forward (a parallel drafter,
        PARD-style: a row fed the pending token, then placeholders, its argmax there the drafts): a row
        of it fed ids[last - d] and chose ids[last - d + 1 .. last] at that slot and the d - 1 after it
        (0: none). A chain proposes one token a call, so no run of calls finds these drafts."""
        for d in range(reach, 1, -1):
            for call in (self.calls[j] for j in proposals):
                for r, end in enumerate(call.last_slots):
                    start = end - d + 1  # the slot fed the pending token
                    if start >= 0 and call.input_ids[r][start] == ids[last - d]:
                        if [argmax_at(call, r, start + i) for i in range(d)] == ids[last - d + 1 : last + 1]:
                            return d
        return 0

    def _draft_row(self, j: int, seq: int | None, row: int, batch_size: int, fed: int, out: int, at: int) -> int | None:
        """Draft call j's row fed `fed` at `at` that proposed `out` for sequence `seq` (`row` of a target
        batch of `batch_size`): declared, else the same index, else the one that fits."""
        call = self.calls[j]
        if call.fed_rows is None:  # its rows by (token fed at the last real slot, argmax there), indexed once:
            call.fed_rows = {}  # a scan per ask would grow with the cube of the batch
            for r, last in enumerate(call.last_slots):
                call.fed_rows.setdefault((call.input_ids[r][last], argmax_at(call, r, last)), []).append(r)
        rows = call.fed_rows.get((fed, out if call.argmax_is_choice else None), [])
        if call.rows is not None:  # declared (the batch map keeps a draft call's rows only at its size)
            rows = [r for r in rows if call.rows[r] == seq]
        elif call.batch_size == batch_size and row in rows:  # the same rows: the same index
            return row
        # Else another order (a packed draft call packs its rows its own way) or other rows: the row
        # whose tokens fit, when one does; sequences that were fed and proposed alike (a trained draft
        # often proposes the same after the same token) by the position they were fed at. Several in
        # a batch of the target's size: not told apart.
        rows = [r for r in rows if call.positions[r][call.last_slots[r]] == at] or rows
        if len(rows) == 1 or call.batch_size != batch_size:
            return next(iter(rows), None)
        return None


def fed_positions(calls: list[CallRecord], chain: tuple[tuple[int, int], ...]) -> list[int]:
    """The position each draft call of the chain fed at its row's last attended slot."""
    return [calls[j].positions[dr][calls[j].last_slots[dr]] for j, dr in chain]


def draft_free_query(call: CallRecord, row: int, committed: list[int]) -> RowQuery | None:
    """The row's query with no draft model (prompt lookup, n-gram, a head): the pending token (the last
    `committed` one) at the first real slot when the row attends a cache, else after its re-fed
    context, by layout (a stale slot does not move it), else by the attended count; None: no drafts."""
    if not committed:
        return None
    view = call.views[row]
    last, run = view.last, view.real_run()  # a pending token fits in the run of real slots before the last
    first = _first_live(view.flags)
    by_layout = first if view.attends_cache() else first + len(committed) - 1
    by_count = last - (view.before(last) + 1 - len(committed))
    for pending in (by_layout, by_count):
        if last - run < pending < last and call.input_ids[row][pending] == committed[-1]:
            return RowQuery(pending, last - pending, ())
    return None


def first_slot_query(call: CallRecord, row: int) -> RowQuery | None:
    """A cached row with no draft model: its first real query slot is pending, the rest drafts."""
    view = call.views[row]
    first = _first_live(view.flags)
    if first > view.last or not all(view.flags[first : view.last + 1]):
        return None
    return RowQuery(first, view.last - first, ())


def _first_live(flags: list[int]) -> int:
    """The first attended query slot (len(flags) when none is)."""
    return next((j for j, keep in enumerate(flags) if keep), len(flags))


def attended_ids(call: CallRecord, row: int, end: int | None = None) -> list[int]:
    """The row's real query tokens up to query slot `end` (default: all of them)."""
    flags = call.views[row].flags
    stop = len(flags) if end is None else end + 1
    return list(compress(call.input_ids[row][:stop], flags[:stop])) or [0]


def row_tokens(call: CallRecord, row: int, rq: RowQuery) -> tuple[list[int], list[int]]:
    """(the row's d drafts, the target's argmax at its d + 1 query slots, or [] if not kept)."""
    drafts = list(call.input_ids[row][rq.pending + 1 : rq.pending + 1 + rq.drafts])
    targets = [argmax_at(call, row, rq.pending + i) for i in range(rq.drafts + 1)]
    return drafts, ([] if None in targets else targets)


def matched_prefix(drafts: list[int], targets: list[int]) -> int | None:
    """The drafts the target agrees with, None unless it chose one token per draft and one more."""
    if len(targets) != len(drafts) + 1:
        return None
    return next((i for i, (x, y) in enumerate(zip(drafts, targets)) if x != y), len(drafts))


SAMPLES = "draft tokens fed are not the draft's argmax: the engine samples (or processes its logits)"


def sampled_drafts(calls: list[CallRecord], targets: list[int]) -> tuple[int, str] | None:
    """(the first verify, why) where the draft calls have extended rows, twice at least, with a token
    not the draft's argmax: a greedy drafter feeds its own choice, a sampling one does not, and it
    samples from its first verify on (the target's choices too), so a run read as greedy there would
    show false violations. None: no such call."""
    seen = other = 0
    for prev, j in zip([-1, *targets], targets):
        pending = _pending_tokens(calls[j])
        for a, b in pairwise(range(prev + 1, j)):  # (the calls between two target calls are draft calls)
            first, then = calls[a], calls[b]
            for r in range(min(first.batch_size, then.batch_size)):
                chose, fed = argmax_at(first, r, first.last_slots[r]), _extension(first, then, r, pending)
                if chose is not None and fed is not None:
                    seen, other = seen + 1, other + (chose != fed)
        if other >= 2:  # (draft calls ran: some target call follows them)
            return next(t for p, t in zip([-1, *targets], targets) if t - p > 1), f"{other} of {seen} {SAMPLES}"
    return None


def _pending_tokens(call: CallRecord) -> set[int]:
    """The token at each row's first real query slot: where a verify starts, its pending token (by
    token alone: a position bug may give the draft another position than the target)."""
    return {attended_ids(call, r)[0] for r in range(call.batch_size) if any(call.views[r].flags)}


def _extension(first: CallRecord, then: CallRecord, r: int, pending: set[int]) -> int | None:
    """The token draft call `then` extends row r of `first` by, as a proposal: the row re-read with one
    more token (no cache), or one token at the next position over its cache that no row of the verify
    starts from (a committed token: the prompt's last after a prefill, a bonus caught up) nor was fed
    just before (a finished row's padding); None where `then` does not extend the row so."""
    before, after = attended_ids(first, r), attended_ids(then, r)
    if after[:-1] == before and not then.views[r].attends_cache():
        return after[-1]
    at = then.positions[r][then.last_slots[r]]
    grown = at == first.positions[r][first.last_slots[r]] + 1 and sum(then.views[r].flags) == 1
    proposed = after[-1] != before[-1] and after[-1] not in pending and not then.drafter
    return after[-1] if grown and proposed and then.views[r].attends_cache() else None
