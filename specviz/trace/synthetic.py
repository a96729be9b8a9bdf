"""A synthetic, model-free EQSPEC trace writer: an independent writer of the documented format.

The "target" is a fixed next-token function of the last two tokens and the "draft" agrees with
it on a hash-chosen ~60% of prefixes, so a run is fully determined, fast at any size, and correct
by construction. Tests mutate single fields of its traces to check the checker, and use big ones
to time it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from specviz.trace.recorder import new_header
from specviz.trace.schema import Header, ModelInfo, RowRecord, SequenceRecord, StepRecord, Trace

VOCAB = 1000
EOS = 0


def target_next(tokens: list[int]) -> int:
    return 1 + (tokens[-1] * 31 + (tokens[-2] if len(tokens) > 1 else 7) * 17) % (VOCAB - 1)


def draft_next(tokens: list[int]) -> int:
    guess = target_next(tokens)
    return guess if (tokens[-1] * 7 + len(tokens)) % 5 < 3 else 1 + guess % (VOCAB - 1)


def synthetic_trace(num_prompts: int, batch_size: int, k: int, max_new: int, seed: int = 0) -> Trace:
    run = SyntheticRun(num_prompts, batch_size, k, max_new, seed)
    steps = list(run.steps())
    return Trace(header=run.header(), steps=steps, sequences=run.sequences())


def write_synthetic_parquet(
    path: str | os.PathLike[str], num_prompts: int, batch_size: int, k: int, max_new: int, seed: int = 0
) -> int:
    """The same run written straight to Parquet a row group at a time: memory grows with the
    prompts, not the steps. Returns the number of row-steps written."""
    from specviz.trace.columnar import ParquetTraceWriter

    run = SyntheticRun(num_prompts, batch_size, k, max_new, seed)
    writer = ParquetTraceWriter(path)
    rows = 0
    try:
        for step in run.steps():
            writer.add_step(step)
            rows += len(step.rows)
    except BaseException:
        writer.abort()
        raise
    writer.close(run.header(), run.sequences())
    return rows


class SyntheticRun:
    """Static batches of `batch_size` prompts, decoded step by step (a generator of steps)."""

    def __init__(self, num_prompts: int, batch_size: int, k: int, max_new: int, seed: int = 0) -> None:
        self.batch_size, self.k, self.max_new, self.seed = batch_size, k, max_new, seed
        self.prompts = [
            [1 + (seed * 13 + i * 7 + j * 3) % (VOCAB - 1) for j in range(3 + (i * 5) % 40)] for i in range(num_prompts)
        ]
        self.outputs: list[list[int]] = [[] for _ in self.prompts]

    def steps(self) -> Iterator[StepRecord]:
        index = 0
        for batch_id, start in enumerate(range(0, len(self.prompts), self.batch_size)):
            active = list(range(start, min(start + self.batch_size, len(self.prompts))))
            while active:
                yield _step(index, batch_id, active, self.prompts, self.outputs, self.k, self.max_new)
                index += 1
                active = [s for s in active if not _done(self.outputs[s], self.max_new)]

    def header(self) -> Header:
        info = ModelInfo(name="synthetic", dtype="float32", device="cpu", vocab_size=VOCAB, num_parameters=0)
        header = new_header(
            method="eqspec",
            fault=None,
            target=info,
            draft=info,
            draft_k=self.k,
            batch_size=self.batch_size,
            max_new_tokens=self.max_new,
            eos_token_ids=[EOS],
            pad_token_id=EOS,
            seed=self.seed,
            library_versions={},
        )
        header.decode_seconds = 1.0
        return header

    def sequences(self) -> list[SequenceRecord]:
        out = []
        for i, p in enumerate(self.prompts):
            reference = _reference(p, self.max_new)
            out.append(
                SequenceRecord(
                    seq_id=i,
                    prompt=f"prompt {i}",
                    prompt_ids=p,
                    output_ids=self.outputs[i],
                    output_text="",
                    reference_ids=reference,
                    reference_margins=[1.0] * len(reference),
                    finish_reason="eos" if self.outputs[i] and self.outputs[i][-1] == EOS else "length",
                )
            )
        return out


def _done(out: list[int], max_new: int) -> bool:
    return len(out) >= max_new or (bool(out) and out[-1] == EOS)


def _reference(prompt: list[int], max_new: int) -> list[int]:
    tokens, out = list(prompt), []
    while not _done(out, max_new):
        out.append(target_next(tokens))
        tokens.append(out[-1])
    return out


def _step(
    index: int, batch_id: int, active: list[int], prompts: list, outputs: list, k: int, max_new: int
) -> StepRecord:
    lengths = [len(prompts[s]) + len(outputs[s]) for s in active]
    cache_len = max(n - 1 for n in lengths)
    rows = []
    for row, (seq_id, n) in enumerate(zip(active, lengths)):
        tokens = prompts[seq_id] + outputs[seq_id]
        drafts: list[int] = []
        for _ in range(k):
            drafts.append(draft_next(tokens + drafts))
        targets = [target_next(tokens + drafts[:j]) for j in range(k + 1)]
        accepted = 0
        while accepted < k and drafts[accepted] == targets[accepted]:
            accepted += 1
        proposal = (drafts[:accepted] + [targets[accepted]])[: max_new - len(outputs[seq_id])]
        emitted = proposal[: proposal.index(EOS) + 1] if EOS in proposal else proposal
        outputs[seq_id].extend(emitted)
        pad = cache_len - (n - 1)
        done = _done(outputs[seq_id], max_new)
        rows.append(
            RowRecord(
                row=row,
                seq_id=seq_id,
                committed_before=n,
                left_pad=pad,
                left_pad_after=None if done else 0,
                pending_token=tokens[-1],
                draft_tokens=drafts,
                target_tokens=targets,
                accepted=accepted,
                bonus=targets[accepted] if len(emitted) == accepted + 1 else None,
                emitted=emitted,
                write_seq=seq_id,
                position_ids=list(range(n - 1, n + k)),
                mask_rle=([[0, pad]] if pad else []) + [[1, n - 1 + k + 1]],
                kv_len=n - 1,
                kv_len_expected=n - 1,
                draft_kv_len=n - 1,
                draft_kv_len_expected=n - 1,
                finished=done,
                finish_reason=("eos" if emitted and emitted[-1] == EOS else "length") if done else None,
            )
        )
    return StepRecord(
        step=index,
        batch_id=batch_id,
        cache_len=cache_len,
        query_len=k + 1,
        grouped=None,
        draft_ms=1.0,
        verify_ms=1.0,
        align_ms=0.1,
        total_ms=2.5,
        rows=rows,
    )
