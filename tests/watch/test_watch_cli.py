"""`python -m specviz watch -- python script.py`: an unmodified script's models are watched.

The script is a batched greedy loop over a tiny random Llama built with `from_config` (no
downloads), left-padded; with position_ids it is clean, without them desync at step 0 on the
padded rows. Run in-process through the CLI's `main`, as the command would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specviz.analysis.check import check_trace
from specviz.analysis.findings import UNFOLLOWED_CHECK
from specviz.cli import main
from specviz.trace.invariants import Invariant
from specviz.trace.io import load_trace

SCRIPT = """
import sys
import torch
import transformers as tf

torch.manual_seed(0)
config = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        bos_token_id=2, eos_token_id=1, pad_token_id=0)
model = tf.AutoModelForCausalLM.from_config(config).eval()
prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20]]
width = max(len(p) for p in prompts)
ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
cache = None
with torch.no_grad():
    for _ in range(6):
        kwargs = {}
        if "--positions" in sys.argv:
            kwargs["position_ids"] = (mask.cumsum(1) - 1)[:, -ids.shape[1]:].clamp(min=0)
        if cache is not None:
            kwargs["past_key_values"] = cache
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
        ids, mask = nxt[:, None], torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], 1)
"""
PADDED_ROWS = {1, 2, 3}


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user") / "loop.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("positions", [True, False], ids=["position-ids", "no-position-ids"])
def test_unmodified_greedy_loop(script: Path, tmp_path: Path, positions: bool) -> None:
    out = tmp_path / "loop.trace.json"
    argv = ["watch", "--out", str(out), "--", "python", str(script)] + (["--positions"] if positions else [])
    assert main(argv) == 0
    trace = load_trace(out)
    assert trace.header.engine == "loop" and trace.header.draft_k == 0
    assert [s.prompt_ids for s in trace.sequences] == [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20]]
    assert len(trace.steps) == 6 and all(len(s.output_ids) == 6 for s in trace.sequences)
    report = check_trace(trace)
    if positions:
        assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
        return
    assert report.verdict == "desync" and report.first_violation.step == 0
    assert {v.row for v in report.violations if v.step == 0 and v.invariant == 2} == PADDED_ROWS


SPECULATIVE = """
import sys
import torch
import transformers as tf
from watch_engine import Bugs, generate

torch.manual_seed(0)


def config(layers):
    return tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          bos_token_id=2, eos_token_id=1, pad_token_id=0)


target = tf.AutoModelForCausalLM.from_config(config(2)).eval()
draft = tf.AutoModelForCausalLM.from_config(config(1)).eval()  # agrees often: the target's first layer
for name in ("model.embed_tokens", "lm_head", "model.layers.0", "model.norm"):
    draft.get_submodule(name).load_state_dict(target.get_submodule(name).state_dict())
prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21]]
generate(target, draft, prompts, 3, 10, frozenset([1]), 0, Bugs(no_position_ids="--bug" in sys.argv))
"""


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("bug", [False, True], ids=["clean", "no-position-ids"])
def test_unmodified_speculative_engine(tmp_path: Path, bug: bool) -> None:
    """tests/support/watch_engine.py, uninstrumented: the larger model is the target, k is found; the engine
    drops finished rows (the batch shrinks), and the command follows the rows left to the end."""
    script = tmp_path / "spec.py"
    script.write_text(SPECULATIVE)
    out = tmp_path / "spec.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(script)] + (["--bug"] if bug else [])) == 0
    trace = load_trace(out)
    assert trace.header.draft_k == 3 and trace.header.draft is not None and trace.header.complete
    assert trace.header.target.num_parameters > trace.header.draft.num_parameters
    assert [s.prompt_ids for s in trace.sequences] == [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21]]
    assert len({len(s.rows) for s in trace.steps}) > 1  # the batch really shrank
    report = check_trace(trace)
    if not bug:
        assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
        assert not trace.header.options.get("watch_notes")
        assert not [s for s in report.skipped_checks if s.check in ("draft", "greedy acceptance", UNFOLLOWED_CHECK)]
        assert all(len(s.output_ids) == 10 or s.finish_reason == "eos" for s in trace.sequences)
        return
    assert report.verdict == "desync" and report.first_violation.step == 0
    assert report.first_violation.invariant == 2


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_crashing_script_still_leaves_an_incomplete_trace(script: Path, tmp_path: Path) -> None:
    crashing = tmp_path / "crash.py"
    crashing.write_text(script.read_text() + "\nraise RuntimeError('boom')\n")
    out = tmp_path / "crash.trace.json"
    assert main(["watch", "--out", str(out), "--no-reference", "--", str(crashing)]) == 1
    trace = load_trace(out)
    assert not trace.header.complete and len(trace.steps) == 6


def test_bad_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--out", str(tmp_path / "t.json"), "--", "python", str(tmp_path / "nope.py")]) == 2
    assert "no such script" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_tokenizer_the_script_builds_gives_the_trace_its_text(script: Path, tmp_path: Path) -> None:
    """The script loads a tokenizer (the embedded one, no download): the trace carries the text of
    its tokens, as `specviz.watch(..., tokenizer=...)` would have written it."""
    from transformers import AutoTokenizer

    from specviz.engine.models import DEFAULT_TARGET

    with_tokenizer = tmp_path / "loop_tok.py"
    with_tokenizer.write_text(f"tok = __import__('transformers').AutoTokenizer.from_pretrained({DEFAULT_TARGET!r})\n")
    with_tokenizer.write_text(with_tokenizer.read_text() + script.read_text())
    out = tmp_path / "tok.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(with_tokenizer), "--positions"]) == 0
    trace = load_trace(out)
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    assert trace.header.token_text, "no piece table"
    assert trace.header.token_text["5"] == tok.decode([5], skip_special_tokens=False)
    assert check_trace(trace).verdict == "clean"
    plain = tmp_path / "plain.trace.json"
    assert main(["watch", "--out", str(plain), "--", "python", str(script), "--positions"]) == 0
    assert not load_trace(plain).header.token_text, "no tokenizer built: IDs only"


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_second_decode_in_the_same_script_holds_new_sequences(tmp_path: Path) -> None:
    """The loop runs again on fresh prompts: its first call (no cache) re-feeds no sequence read so
    far, so its rows are new sequences, followed like the first ones (both decodes checked)."""
    head, loop = SCRIPT.split("prompts = ", 1)
    again = loop.replace(
        "[[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20]]", "[[30, 31], [32], [33, 34, 35], [36]]"
    )
    script = tmp_path / "twice.py"
    script.write_text(head + "prompts = " + loop + "prompts = " + again)
    out = tmp_path / "twice.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(script), "--positions"]) == 0
    trace = load_trace(out)
    assert [s.prompt_ids for s in trace.sequences][4:] == [[30, 31], [32], [33, 34, 35], [36]]
    assert trace.header.complete and len(trace.steps) == 12 and all(len(s.output_ids) == 6 for s in trace.sequences)
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]


HEAD_SCRIPT = Path(__file__).parent / "zoo" / "scripts" / "run_engine.py"
HEAD_ARGS = ["head", "--prompts", "[[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]]", "--budgets", "6"]


def _watch_head(tmp_path: Path, drafter: str | None, bug: str | None = None) -> tuple[int, object]:
    """The zoo's head engine (an EAGLE-like `DraftHead`, no draft model) under the command."""
    out = tmp_path / f"head-{drafter}-{bug}.trace.json"
    argv = ["watch", "--out", str(out), *(["--drafter", drafter] if drafter else [])]
    argv += ["--", "python", str(HEAD_SCRIPT), *HEAD_ARGS, *(["--bug", bug] if bug else [])]
    return main(argv), load_trace(out)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_drafter_names_the_head_so_its_input_is_checked(tmp_path: Path) -> None:
    """`--drafter DraftHead`: the head (a plain nn.Module, never a causal LM) is found at its first
    call and its input checked: a head fed the row below's hidden state is a head-input violation
    at the bug's step, where the same run without the flag reads clean (outputs stay exact: the
    target verifies). The search's global hook is gone afterwards."""
    from torch.nn.modules import module as torch_module

    status, named = _watch_head(tmp_path, "DraftHead", bug="head_row")
    assert status == 0 and named.header.proposer == "head"
    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks, "search left"
    report = check_trace(named)
    v = report.first_violation
    assert report.exact_match == 1.0 and v is not None
    assert (v.step, v.seq_id, v.invariant) == (1, 0, Invariant.HEAD), report.violations[:3]
    status, unnamed = _watch_head(tmp_path, None, bug="head_row")
    assert status == 0 and unnamed.header.proposer != "head"
    assert check_trace(unnamed).verdict == "clean"  # what the flag is for: nothing else sees this bug
    status, dotted = _watch_head(tmp_path, "zoo.head.DraftHead")  # the class with its module path
    assert status == 0 and dotted.header.proposer == "head"
    drafting = [row for step in dotted.steps for row in step.rows if row.draft_tokens]
    assert drafting and all(row.head_source == [row.seq_id, row.committed_before - 2] for row in drafting)
    assert check_trace(dotted).verdict == "clean"


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(
    "name", ["NoSuchHead", "LlamaMLP", "oo.head.DraftHead"], ids=["never-built", "a-layer-of-the-target", "a-cut-path"]
)
def test_drafter_never_called_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """A class never called outside the causal LMs (not in the script, or a layer of the target) is
    said in one line, on stderr and in the trace: never a silent clean with the head unchecked."""
    from torch.nn.modules import module as torch_module

    status, trace = _watch_head(tmp_path, name)
    assert status == 0 and trace.header.proposer != "head"
    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks
    said = f"--drafter {name}: no module of that class was called outside the causal LMs"
    assert said in capsys.readouterr().err
    assert any(said in note for note in trace.header.options["watch_notes"])
    assert trace.header.complete  # the run itself was read to the end


def test_drafter_takes_a_class_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["watch", "--out", str(tmp_path / "t.json"), "--drafter", "my head", "--", str(HEAD_SCRIPT)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--drafter takes a class name" in err[0]


def test_a_script_runs_from_its_own_folder_and_a_module_from_the_working_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`script_argv`: the script's path (after `--` and `python`) with its argv and its folder; with
    `-m`, the module with its argv and the working folder, as `python` would import from."""
    import os

    from specviz.errors import SpecvizError
    from specviz.watch.cli import script_argv

    script = tmp_path / "engine.py"
    script.write_text("")
    monkeypatch.chdir(tmp_path.parent)
    target, argv, _, folder = script_argv(["--", "python", str(script), "--fast"])
    assert (target, argv, folder) == (str(script), [str(script), "--fast"], str(tmp_path))
    target, argv, _, folder = script_argv(["python3", "-m", "pkg.engine", "x"])
    assert (target, argv, folder) == ("pkg.engine", ["pkg.engine", "x"], os.getcwd())
    for words, says in ((["--", "python"], "name the script"), (["-m"], "-m needs"), ([str(tmp_path)], "no such")):
        with pytest.raises(SpecvizError, match=says):
            script_argv(words)
