"""What a method provides to `run`: its runner, the layout its traces declare, its header options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specviz.engine.batch import SeqState
    from specviz.engine.config import RunConfig
    from specviz.engine.step import Engine

# run(engine, seqs, config) decodes every sequence; returns header options learned while running
MethodRunner = Callable[["Engine", "list[SeqState]", "RunConfig"], dict[str, Any]]


def no_options(config: RunConfig) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Method:
    run: MethodRunner
    layout: str = "left-padded"  # the trace header's `layout` (trace/schema.py LAYOUTS)
    options: Callable[[RunConfig], dict[str, Any]] = no_options  # header options known before the run
