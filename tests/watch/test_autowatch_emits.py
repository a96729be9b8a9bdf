"""The command keeps the target's and the draft's calls only (`AutoWatch._relabeled`): what the paged
manager reported after a number of calls is counted again over the calls kept, so a third causal LM
that ran forwards in between does not move a report past the calls it followed."""

from __future__ import annotations

import torch
from tiny import build

from specviz.watch.autowatch import AutoWatch


def test_reports_count_only_the_calls_kept() -> None:
    target, draft, other = build("llama", 2, 64), build("llama", 1, 64), build("llama", 1, 32)
    watcher = AutoWatch()
    for model in (target, draft, other):
        watcher.adopt(model)
    ids = torch.tensor([[5, 6, 7]])
    try:
        target(ids)
        other(ids)  # a third model's call: dropped
        watcher.report(0, [1])
        target(ids)
        draft(ids)
        watcher.report(0, [2])
    finally:
        watcher.uninstall()
    kept_target, kept_draft, calls = watcher._relabeled()
    assert kept_target is target and kept_draft is draft
    assert [c.role for c in calls] == ["target", "target", "draft"]
    assert [e.after for e in watcher._emits] == [1, 3]  # was [2, 4]: past the calls it followed
