"""What to do next, per verdict: the last lines of the text output and `next_steps` in the report.

Each step names a command or a setting that tells the user more than the probe could: a numerical
verdict is confirmed by running the server with batch-invariant kernels (the divergences must
vanish), a suspect prompt is replayed alone and opened in the app, an acceptance collapse is
bisected between the last level that held and the first that collapsed.
"""

from __future__ import annotations

from specviz.probe import report as rp

SHOWN = 5  # prompts named in one step at most


def _prompts(indices: list[int]) -> str:
    shown = ", ".join(f"#{i}" for i in indices[:SHOWN])
    return shown + (f" and {len(indices) - SHOWN} more" if len(indices) > SHOWN else "")


def placeholder_line(side: rp.Side, name: str) -> str | None:
    """'412 of 768 tokens on side B carry no logprob: drafted tokens ...', or None."""
    if not side.placeholders:
        return None
    return (
        f"{side.placeholders} of {side.tokens} tokens on side {name} carry no logprob: drafted tokens "
        "(placeholders, left out of the noise and the margins)"
    )


def next_steps(report: rp.ProbeReport) -> tuple[str, ...]:
    steps: list[str] = []
    by_verdict: dict[str, list[int]] = {}
    for p in report.prompts:
        by_verdict.setdefault(p.verdict, []).append(p.index)
    if report.collapse is not None:
        c = report.collapse
        below = [v.concurrency for v in report.levels if v.concurrency < c.concurrency]
        held = max(below, default=1)
        answers = "the answers stay right" if report.verdict in ("identical", "numerical") else "answers differ"
        steps.append(
            f"acceptance collapses at concurrency {c.concurrency} ({c.detail}) while {answers}. "
            f"Bisect with --concurrency {held},{c.concurrency} --rounds 3 "
            "(levels in between), then the drafting path: the draft's batched forward (per-row positions and KV "
            "cache), the acceptance check's row indexing, and scheduling (async or overlapped); switch the draft "
            "method (draft model or n-gram) to see which part it follows"
        )
    suspect = by_verdict.get("suspect", [])
    if suspect:
        steps.append(
            f"suspect {_prompts(suspect)}: replay them alone (--prompts with only those, --replay MODEL_PATH "
            "in the server's dtype) and open the report (--out FILE) in the app's Server probe section "
            "(python app.py) to see where the answers part"
        )
    unattributed = by_verdict.get("unattributed", [])
    if unattributed:
        steps.append(
            f"unattributed {_prompts(unattributed)}: the noise of the compute path where they diverged was not "
            "measured, or no logprob at the divergence (each prompt's reason says which, and what measures it); "
            "rerun with --replay MODEL_PATH to score them locally, or --logprobs 5"
        )
    if by_verdict.get("numerical") and not suspect:
        steps.append(
            "numerical: confirm with batch-invariant kernels; the divergences must vanish: vLLM "
            "VLLM_BATCH_INVARIANT=1, SGLang --enable-deterministic-inference (llama.cpp has no such mode: "
            "compare -np 1 against -np N)"
        )
    corrupt = [p.index for p in report.prompts if p.findings]
    if corrupt:
        steps.append(
            f"side B's text shows what A's lacks on {_prompts(corrupt)} (see each prompt's findings): "
            "replay those prompts at that concurrency with --rounds to see how often"
        )
    if report.verdict == "identical" and report.collapse is None:
        steps.append(
            "identical: for rare corruption raise --rounds (20 finds a prompt that diverges once in 20), "
            "for load effects sweep --concurrency 1,2,4,8,16"
        )
    return tuple(steps)
