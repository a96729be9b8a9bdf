"""A sequence's last step, read from what the script decoded (`specviz watch --`,
`infer.decoded`): no later call shows what that step kept, but a script that prints its outputs
passes them to its tokenizer's `decode`, which the command records.

The oracle is independent of specviz: batch-1 greedy of the target on every prompt, each to its own
budget (`shapes.reference`, unwatched), and the tree engine's own report of where its bug fired.
Then, through the command, with the tree head engine (`tests/watch/test_zoo_tree.py`'s EQUAL run):
(a) `off_path` fires at a sequence's last step; decoded, the run does not read clean, and the
    sequence's first divergent token is that step's first token, at that step;
(b) the correct run, decoded with its prompts, reads clean with no token read as greedy;
(c) a script that decodes nothing reads as before (the last steps read as greedy).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import make_pair
from zoo import shapes
from zoo.command import watch_script

from specviz.analysis.check import check_trace
from specviz.watch.autowatch import AutoWatch
from specviz.watch.infer.decoded import (
    MAX_LISTS,
    DecodedLog,
    decoded_tail,
    id_lists,
    strip_pads,
    tail_after,
    takes,
)

EOS = {1}
PAD = 0
PROMPT = [5, 6, 7]
SEEN = [20, 21]

# --------------------------------------------------------------------- the matching, unit by unit


def test_id_lists_reads_tensors_arrays_and_lists() -> None:
    assert id_lists(torch.tensor([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert id_lists(np.array([7, 8, 9])) == [[7, 8, 9]]
    assert id_lists([4, 5]) == [[4, 5]]
    assert id_lists(([4], [5, 6])) == [[4], [5, 6]]  # ragged: one list per sequence
    assert id_lists([torch.tensor([4, 5]), np.array([6])]) == [[4, 5], [6]]  # a list of rows
    assert id_lists(list(np.array([7, 8]))) == [[7, 8]]  # numpy ints
    for bad in (3, "text", [], [[1], 2], [True, False], [1.5], None, [[["x"]]]):
        assert id_lists(bad) == []


def test_the_log_is_bounded_and_says_so() -> None:
    log = DecodedLog()
    for _ in range(MAX_LISTS + 5):
        log.add([1, 2], PAD)
    assert len(log.lists) == MAX_LISTS and log.full
    assert "no longer recorded" in (log.note() or "")
    big = DecodedLog()
    big.add([[0] * 600_000, [0] * 600_000], None)  # the second list passes 1,000,000 ids
    assert len(big.lists) == 1 and big.full
    assert DecodedLog().note() is None


def test_pads_are_stripped_at_both_ends_only() -> None:
    assert strip_pads([0, 0, 5, 0, 6, 0], {0}) == [5, 0, 6]
    assert strip_pads([0, 0], {0}) == []
    assert strip_pads([5, 6], set()) == [5, 6]


def test_a_prompt_prefixed_list_and_an_output_only_list_give_the_tail() -> None:
    assert tail_after(PROMPT + SEEN + [30, 31], PROMPT, SEEN, EOS) == [30, 31]
    assert tail_after(SEEN + [30], PROMPT, SEEN, EOS) == [30]
    assert tail_after(PROMPT + SEEN, PROMPT, SEEN, EOS) is None  # not longer than what was seen
    assert tail_after([9, *SEEN, 30], PROMPT, SEEN, EOS) is None  # another sequence's
    assert tail_after([30, 31], PROMPT, [], EOS) is None  # nothing seen: every list would fit
    assert tail_after(PROMPT + [30, 31], PROMPT, [], EOS) == [30, 31]


@pytest.mark.parametrize("padded", ["left", "right", "both"])
def test_padding_of_either_side_is_stripped(padded: str) -> None:
    ids = PROMPT + SEEN + [30]
    ids = {"left": [PAD, PAD] + ids, "right": ids + [PAD] * 3, "both": [PAD] + ids + [PAD]}[padded]
    assert decoded_tail([(ids, PAD)], PROMPT, SEEN, EOS) == [30]
    assert decoded_tail([(ids, None)], PROMPT, SEEN, EOS, engine_pad=PAD) == [30]  # the engine's pad


def test_the_tail_is_cut_after_the_first_eos() -> None:
    assert decoded_tail([(SEEN + [30, 1, 44, 45], None)], PROMPT, SEEN, EOS) == [30, 1]


def test_identical_sequences_share_a_tail_and_two_tails_are_never_chosen_between() -> None:
    same = [(PROMPT + SEEN + [30], PAD), (PROMPT + SEEN + [30, PAD], PAD)]
    assert decoded_tail(same, PROMPT, SEEN, EOS) == [30]
    two = [(PROMPT + SEEN + [30], PAD), (PROMPT + SEEN + [31], PAD)]
    assert decoded_tail(two, PROMPT, SEEN, EOS) is None
    assert decoded_tail([([8, 9, 10], PAD)], PROMPT, SEEN, EOS) is None  # no list fits


def test_a_tail_is_taken_only_where_the_step_could_have_committed_it() -> None:
    greedy = [30, 31]
    assert takes([30, 99], greedy, greedy, 3, EOS)  # a wrong token: taken
    assert takes([30, 31], greedy, greedy, 3, EOS)  # the reading, seen
    assert not takes([30, 31, 32, 33], greedy, greedy, 3, EOS)  # more than drafts + 1
    assert not takes([30, 31], [30], greedy, 3, EOS)  # past the shared budget that cut the step
    assert takes([99], [30], greedy, 3, EOS)  # within it
    assert takes([30], greedy, greedy, 3, EOS)  # shorter: the engine's own budget cut the step
    assert not takes([30], [30, 1], [30, 1], 3, EOS)  # only short of the EOS (a pad that is the EOS)
    assert takes([99], [30, 1], [30, 1], 3, EOS)  # a token that differs before it


# --------------------------------------------------------------------- the patch


def test_the_decode_patch_records_and_is_restored() -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    original = PreTrainedTokenizerBase.decode
    watcher = AutoWatch()
    watcher.install()
    try:
        backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(8)}, unk_token="w3"))
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0", eos_token="w1")
        assert tok.batch_decode(torch.tensor([[0, 2, 5], [4, 6, 0]])) == ["w0 w2 w5", "w4 w6 w0"]
        assert tok.decode([2, 7]) == "w2 w7"
        with pytest.raises(Exception):  # noqa: B017 (the tokenizer's own error, not the patch's)
            tok.decode(object())
    finally:
        watcher.uninstall()
    assert PreTrainedTokenizerBase.decode is original
    assert watcher.decoded.lists == [([0, 2, 5], 0), ([4, 6, 0], 0), ([2, 7], 0)]
    tok.decode([5])
    assert len(watcher.decoded.lists) == 3  # uninstalled: nothing more recorded


# --------------------------------------------------------------------- end to end, through the command

EQUAL = [[91, 86, 70, 6], [62, 34, 86, 9], [23, 17, 50, 63], [34, 51, 72, 16]]  # test_zoo_tree's
EQUAL_BUDGETS = [6, 3, 6, 9]


@pytest.fixture(scope="module")
def reference():
    return shapes.reference(make_pair("llama").target, EQUAL, EQUAL_BUDGETS)


def _run(tmp: Path, bug: str | None, decode: str | None):
    args = ["--decode", decode] if decode else []
    return watch_script(tmp / "decoded.trace.json", "tree", EQUAL, EQUAL_BUDGETS, bug, {"head": 1}, args)


def _last_step(trace, seq: int) -> int:
    return max(si for si, step in enumerate(trace.steps) for row in step.rows if row.seq_id == seq)


@pytest.mark.parametrize("decode", ["full", "outputs"])
def test_a_wrong_token_at_a_last_step_is_seen_in_the_decoded_outputs(tmp_path: Path, reference, decode) -> None:
    trace, outs, events = _run(tmp_path, "off_path", decode)
    assert events and outs != reference  # a wrong output, by the engine's own account
    step, seq = events[0][:2]
    assert step == _last_step(trace, seq)  # the bug fired at that sequence's last step
    report = check_trace(trace)
    assert report.verdict != "clean" and report.exact_match < 1.0
    verdict = report.sequences[seq]
    seen = sum(len(row.emitted) for s in trace.steps[:step] for row in s.rows if row.seq_id == seq)
    assert (verdict.first_divergence, verdict.divergence_step) == (seen, step)
    first = next(i for i, (a, b) in enumerate(zip(outs[seq], reference[seq])) if a != b)
    assert first == seen  # where the engine's own output leaves the reference
    read = report.read_as_greedy or {"sequences": 0}
    assert str(seq) not in trace.header.options.get("watch_read_as_greedy", {})
    assert read["sequences"] < len(EQUAL)


def test_the_correct_run_decoded_reads_clean_with_nothing_read_as_greedy(tmp_path: Path, reference) -> None:
    trace, outs, _ = _run(tmp_path, None, "full")
    assert outs == reference
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
    assert report.read_as_greedy is None and "watch_read_as_greedy" not in trace.header.options


def test_a_script_that_decodes_nothing_keeps_the_greedy_reading(tmp_path: Path, reference) -> None:
    trace, outs, events = _run(tmp_path, "off_path", None)
    assert events and outs != reference
    report = check_trace(trace)
    assert report.read_as_greedy == {"sequences": len(EQUAL), "tokens": report.read_as_greedy["tokens"]}
    assert report.verdict == "clean"  # as read: docs/watch-command.md's limit, with the note


LOOKUP = """
import sys
import torch
import transformers as tf
from tokenizers import Tokenizer, models

config = tf.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        bos_token_id=2, eos_token_id=1, pad_token_id=95)
torch.manual_seed(0)
target = tf.AutoModelForCausalLM.from_config(config).eval()
ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 12]])
out = target.generate(ids, attention_mask=torch.ones_like(ids), prompt_lookup_num_tokens=4, do_sample=False,
                      max_new_tokens=40, min_new_tokens=40)
backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(96)}, unk_token="w3"))
tok = tf.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w95", eos_token="w1")
text = tok.batch_decode(out)
"""


@pytest.mark.filterwarnings("ignore")
def test_a_last_step_cut_after_verification_is_read_from_the_decoded_output(tmp_path: Path) -> None:
    """HF prompt lookup verifies 4 drafts where the budget leaves room for fewer and cuts its output
    afterwards: no later call shows the cut (test_hf_generate.py reads up to 4 tokens more), the
    decoded output does, so the trace holds the 40 tokens `generate` returned, all seen."""
    from specviz.cli import main
    from specviz.trace.io import load_trace

    script = tmp_path / "lookup.py"
    script.write_text(LOOKUP)
    out = tmp_path / "lookup.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(script)]) == 0
    trace = load_trace(out)
    report = check_trace(trace)
    assert len(trace.sequences[0].output_ids) == 40 and trace.header.draft_k == 4
    assert report.verdict == "clean" and report.exact_match == 1.0 and report.read_as_greedy is None
