"""HF `generate` reports its tokens through a streamer; this one turns them into `emit` calls.

`generate` hands over the prompt batch, then one token per row per step; rows are the prompts in
order. A finished row's padding is not emitted; what is unfinished at the end ran out of budget."""

from __future__ import annotations

from typing import Any


class GenerateStreamer:
    """Pass as `generate(..., streamer=w.streamer())`; greedy, no assistant model."""

    def __init__(self, watch: Any, eos_ids: frozenset[int], batch_size: int) -> None:
        self.watch, self.eos, self.batch_size = watch, eos_ids, batch_size
        self.saw_prompt = False
        self.finished: set[int] = set()

    def put(self, value: Any) -> None:
        if not self.saw_prompt:  # the first call carries the prompts
            self.saw_prompt = True
            return
        tokens = value.reshape(self.batch_size, -1).tolist()
        for seq_id in sorted(set(range(self.batch_size)) - self.finished):
            row = tokens[seq_id]
            ended = next((i + 1 for i, t in enumerate(row) if t in self.eos), None)
            if ended is None:
                self.watch.emit(seq_id, row, None)
            else:  # up to its EOS; the row is padding from then on
                self.watch.emit(seq_id, row[:ended], "eos")
                self.finished.add(seq_id)

    def end(self) -> None:
        for seq_id in sorted(set(range(self.batch_size)) - self.finished):
            self.watch.emit(seq_id, [], "length")
        self.finished.update(range(self.batch_size))
