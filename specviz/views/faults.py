"""What each injectable fault does, in one or two lines, for the places the UI names a fault.

A plain dict keyed by fault name, so views never import the engine (and torch) to explain one;
`tests/app/test_ux.py` checks that every fault of `specviz.engine.faults.FAULTS` has its line. The
long form, with the invariant each breaks and the real bugs behind it, is `docs/faults.md`.
"""

from __future__ import annotations

from specviz.views.safe_text import md_text

# The app serves docs/ pages here (`specviz.app.doc_pages`): a link names the page, never the
# folder the app is installed in.
DOCS_URL_PREFIX = "/specviz/docs/"
FAULTS_DOC_URL = DOCS_URL_PREFIX + "faults.md"

FAULT_DESCRIPTIONS: dict[str, str] = {
    "uniform-advance": "every row advances its cache and positions by the batch's longest acceptance + 1, "
    "not its own: rows that accepted fewer drafts get position gaps and stale KV.",
    "column-positions": "position IDs are the padded tensor's column index, ignoring each row's left "
    "padding: every padded row is fed positions too large from step 0.",
    "masked-holes": "rejected drafts stay in the cache masked out while positions still count them: "
    "holes inside the row and positions that run ahead.",
    "pad-accumulation": "re-padding keeps the old padding, which becomes attended row content: "
    "extra attended slots and drifting positions after a realignment.",
    "stale-kv": "the cache is trimmed once for the batch (by the longest acceptance), so rows that "
    "accepted fewer drafts still attend their rejected drafts' KV.",
    "extra-accept": "verification accepts one draft past the first mismatch (off by one): a token the "
    "target did not predict is emitted.",
    "row-mixup": "after the batch is regrouped, a row's tokens are written to the next row's sequence.",
    "missing-bonus-kv": "after an all-accepted step the draft never computes KV for its last token: "
    "the draft cache is one short; outputs stay exact, acceptance drops.",
    "draft-positions": "the draft is fed position IDs one past the right ones; the target verifies, "
    "so outputs stay exact while acceptance drops.",
    "kv-row-copy": "once, row 0's cached keys and values are overwritten with row 1's; masks and "
    "counts look right, only the cache content is wrong.",
    "request-order": "results are scattered back in request order, not the batch's row order: a row's "
    "tokens land in another request (vLLM V1 spec decode, 2025).",
    "head-source-index": "each row's draft head is fed the next row's hidden state: outputs stay exact, "
    "acceptance collapses (vllm-ascend EAGLE-3, 2025).",
    "shared-carry": "every row's draft head reads row 0's carry-over state: outputs stay exact, "
    "acceptance collapses (a llama.cpp fork's MTP, 2026).",
    "tree-sibling-mask": "the tree mask is causal over the flattened tree, so a node also sees its "
    "siblings: alternatives are scored in the wrong context.",
    "tree-node-positions": "each tree node is fed its node index as position offset instead of its "
    "depth: alternatives sit at the wrong position.",
    "stale-pending": "once, a row feeds the token it fed the step before instead of its pending token, "
    "as a request rescheduled before its tokens were written back (vLLM #52071).",
    "async-ahead": "the next step's positions and cache length are built as if every draft was accepted: "
    "rows that accepted fewer run ahead by k minus accepted (vLLM-Ascend #10032).",
    "mid-batch-pad": "a padded dummy row sits mid-batch and the per-row offsets are not compacted: rows "
    "after it are fed their neighbour's positions (TensorRT-LLM #6136).",
    "stale-draft-map": "draft calls after the first reuse the verify's token-to-row map: rows read "
    "another row's draft; outputs stay exact, deeper acceptance falls (TensorRT-LLM #17240).",
    "penalty-history": "the repetition penalty's history gets one token per step, not every accepted "
    "token: outputs differ only with a penalty on (SGLang #33643, vLLM #30122).",
    "chunk-boundary-feed": "a chunked prefill feeds the draft the target's predicted token at each chunk "
    "boundary instead of the prompt's: outputs stay exact, acceptance drops (SGLang #26329).",
    "rider-position": "a prefill chunk riding in a verify forward is fed positions from its column in "
    "the mixed batch, not from its own cached tokens: its keys sit at the wrong positions.",
}


def fault_description(name: str | None) -> str:
    """The one-liner for a fault name; empty for no fault, a plain note for an unknown one."""
    if not name or name == "none":
        return ""
    return FAULT_DESCRIPTIONS.get(name, "a fault this version of specviz does not describe.")


def fault_markdown(name: str | None) -> str:
    """`Fault X: what it does (docs/faults.md)` as one Markdown line; empty for no fault."""
    text = fault_description(name)
    if not text:
        return ""
    # A known name is ours and goes in a code span; any other came from the file and is escaped.
    shown = f"`{name}`" if name in FAULT_DESCRIPTIONS else md_text(name or "")
    return f"**Fault {shown}**: {text} ([docs/faults.md]({FAULTS_DOC_URL}))"


def faults_markdown() -> str:
    """Every fault, one line each: shown beside the live run's fault picker."""
    lines = [f"- `{name}`: {text}" for name, text in FAULT_DESCRIPTIONS.items()]
    return "\n".join(lines) + f"\n\nMore, with the real bugs behind each: [docs/faults.md]({FAULTS_DOC_URL})."
