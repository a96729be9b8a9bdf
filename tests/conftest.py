"""Fixtures shared across the suite: the tiny model pair saved to folders, and one set of runs of
it (correct and with faults) on a ragged batch. Helpers that are not fixtures live in
`tests/support/` (on the path: `from tiny import make_pair`)."""

import os
import shutil
import tempfile

import pytest
import torch
from ragged import RAGGED_FAULTS, RAGGED_K, RAGGED_PROMPTS

torch.set_num_threads(1)  # tiny models: threads only add contention

# Gradio's uploads and downloads of this test session go to a folder of its own, removed at the
# end (set before any test module imports gradio, which reads it then; servers the tests start
# inherit it): a test run leaves nothing in /tmp/gradio.
if "GRADIO_TEMP_DIR" not in os.environ:
    _GRADIO_TEMP = tempfile.mkdtemp(prefix="specviz-tests-gradio-")
    os.environ["GRADIO_TEMP_DIR"] = _GRADIO_TEMP
else:
    _GRADIO_TEMP = None


# Under CI=true a skip that is not allowed by design fails (tests/support/ci_skips.py); the
# session's test count is kept for the docs' counts (tests/support/suite_size.py).
pytest_plugins = ("ci_skips", "suite_size")


def pytest_sessionfinish(session, exitstatus) -> None:
    if _GRADIO_TEMP is not None:
        shutil.rmtree(_GRADIO_TEMP, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The tiny target and draft saved as model folders (target, draft), as a user's would be."""
    from tiny import save_tiny_model_dirs

    return save_tiny_model_dirs(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def traces() -> dict:
    """EQSPEC and EXSPEC runs of the tiny pair, and EQSPEC with each of four faults: batch 4 over
    six prompts of mixed lengths, k = 3, 12 new tokens, with token text attached."""
    from tiny import make_pair

    from specviz.engine.config import RunConfig
    from specviz.engine.run import greedy_references, run, tokenize_prompts
    from specviz.views.tokens import attach_token_text

    pair = make_pair("llama")
    new = 12
    # The batch-1 greedy oracle, decoded once by the function `run` decodes it with (not once per
    # run: the six runs share pair, prompts and budget), attached as `reference=True` writes it.
    references = greedy_references(pair, tokenize_prompts(pair, RAGGED_PROMPTS, new), new)
    common = {"batch_size": 4, "draft_k": RAGGED_K, "max_new_tokens": new, "reference": False}
    out = {
        "eqspec": run(pair, RAGGED_PROMPTS, RunConfig(method="eqspec", **common)),
        "exspec": run(pair, RAGGED_PROMPTS, RunConfig(method="exspec", exspec_window=6, **common)),
    }
    for fault in RAGGED_FAULTS:
        out[fault] = run(pair, RAGGED_PROMPTS, RunConfig(method="eqspec", fault=fault, **common))
    for trace in out.values():
        for seq in trace.sequences:  # sequence i is prompt i
            seq.reference_ids, seq.reference_margins = map(list, references[seq.seq_id])
        attach_token_text(trace, pair.tokenizer)  # the references' tokens too
    return out
