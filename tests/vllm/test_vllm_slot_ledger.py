"""The slot ledger (specviz/watch/vllm/slots.py) against a plain recomputation: what each slot
holds, judged again only where something changed, gives the same answer as judging every slot
every time, including slots past a reader's known tokens. Needs no vLLM."""

import random

from specviz.watch.vllm.slots import ROOT, SlotLedger, block_slots, join_runs, prefixes, runs


def _naive(ledger, reads, hashes):
    return [j for j in range(len(reads)) if j >= len(hashes) or ledger.held.get(reads[j]) != (j, hashes[j])]


def test_incremental_judgement_equals_full_recheck():
    rng = random.Random(0)
    ledger = SlotLedger()
    bs, tables = (
        4,
        {"a": [3, 7, 1, 9, 11, 13, 15, 17, 19, 21, 23, 25], "b": [5, 2, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24]},
    )
    tokens = {name: [rng.randrange(50) for _ in range(3)] for name in tables}
    for _ in range(40):
        name = rng.choice(sorted(tables))
        toks = tokens[name]
        new = [rng.randrange(50) for _ in range(rng.randrange(1, 3))]
        reads = block_slots(tables[name], len(toks) + len(new), bs)
        start = len(toks)
        writes = reads[start:]
        if rng.random() < 0.2:  # a stray write into the other request's blocks
            other = tables["b" if name == "a" else "a"]
            writes = [other[0] * bs + rng.randrange(bs)] + writes[1:]
        ledger.write(writes, range(start, start + len(new)), prefixes(toks)[-1] if toks else ROOT, new)
        toks += new
        for reader in sorted(tables):
            ctx = len(tokens[reader]) + rng.choice([-1, 0, 1])  # sometimes past its own tokens
            reads = block_slots(tables[reader], ctx, bs)
            hashes = prefixes(tokens[reader])[:ctx]
            assert ledger.bad(reader, reads, hashes, stable=len(hashes)) == _naive(ledger, reads, hashes)


def test_shared_prefix_is_the_same_kv():
    ledger = SlotLedger()
    ledger.write([8, 9], [0, 1], ROOT, [5, 6])  # request a writes "5 6"
    same, other = prefixes([5, 6]), prefixes([5, 7])
    assert ledger.bad("b", [8, 9], same, stable=2) == []  # b shares the prefix: the same KV
    assert ledger.bad("c", [8, 9], other, stable=2) == [1]  # c's second token differs


def test_runs_code_the_failing_indices():
    assert runs(5, []) == [[1, 5]]
    assert runs(5, [0, 1, 4]) == [[0, 2], [1, 2], [0, 1]]
    assert join_runs(runs(3, []), runs(2, [1])) == [[1, 4], [0, 1]]


def test_a_draft_call_fed_embeddings_gives_no_draft_fields_not_a_crash():
    """A drafter fed embeddings, or no positions (capture records None for either): the step keeps
    no draft-side fields, as where no draft model ran (it raised a TypeError before)."""
    from specviz.watch.vllm.steps import _draft_calls

    call = {"input_ids": None, "positions": [5], "query_start_loc": [0, 1], "slot_mapping": [80], "block_table": [[5]]}
    drafting = {"draft_calls": [call], "req_ids": ["a"], "block_size": 16}
    assert _draft_calls(drafting, SlotLedger(), {}, {"a": (5, prefixes([1, 2, 3, 4, 5, 6]))}) == {}
    call.update(input_ids=[6], positions=None)
    assert _draft_calls(drafting, SlotLedger(), {}, {"a": (5, prefixes([1, 2, 3, 4, 5, 6]))}) == {}
