"""specviz's own engine under `specviz.watch`: its recorder's job done by the watch's two calls,
in a subclass of its Engine (for the tests that compare the two)."""

from __future__ import annotations

from typing import Any


def run_watched_engine(pair: Any, texts: list[str], config: Any, w: Any) -> None:
    """Run the engine on `texts` with `config`, declaring each step's rows and emitting what each
    sequence gained to the open watch `w` (the caller closes it)."""
    from specviz.engine import run as run_module

    class WatchedEngine(run_module.Engine):
        def step(self, batch):
            w.rows([s.seq_id for s in batch.seqs])
            before = [len(s.output_ids) for s in batch.seqs]
            outcome = super().step(batch)
            for seq, n in zip(batch.seqs, before):
                w.emit(seq.seq_id, seq.output_ids[n:], seq.finish_reason)
            return outcome

    original = run_module.Engine
    run_module.Engine = WatchedEngine
    try:
        run_module.run(pair, texts, config)
    finally:
        run_module.Engine = original
