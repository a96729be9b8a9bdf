"""Prompts: the vendored SpecBench questions (Apache-2.0, see data/ATTRIBUTION.md) or a user file."""

from __future__ import annotations

import json
from pathlib import Path

from specviz.errors import PromptError
from specviz.files import FileRefused, read_regular_file

SPECBENCH = Path(__file__).resolve().parent / "data" / "spec_bench_question.jsonl"
MAX_PROMPTS_BYTES = 64 * 1024 * 1024  # far above any prompt set a run can decode


# The default pair was trained on turns followed by EOS, so right after a bare question its
# likeliest token is EOS (42% of held-out prompts). A newline, as a chat template puts between a
# question and its answer, makes it answer instead (0% EOS-first on the same prompts).
ANSWER_SEPARATOR = "\n"


def load_specbench(split: str = "all") -> list[str]:
    """First turns of SpecBench, each followed by ANSWER_SEPARATOR.

    `heldout` = line index % 5 == 0 (never seen by the default pair), `train` = the rest.
    """
    prompts = [p + ANSWER_SEPARATOR for p in _read_jsonl(SPECBENCH)]
    if split == "all":
        return prompts
    if split == "heldout":
        return [p for i, p in enumerate(prompts) if i % 5 == 0]
    if split == "train":
        return [p for i, p in enumerate(prompts) if i % 5 != 0]
    raise PromptError(f"unknown prompt split {split!r}; use all, heldout or train")


def load_prompts_file(path: str | Path) -> list[str]:
    """JSONL with one prompt per line: {"prompt": ...}, {"text": ...}, {"turns": [...]} or a string."""
    path = Path(path)
    prompts = _read_jsonl(path)
    if not prompts:
        raise PromptError(f"{path}: no prompts in file")
    return prompts


def _read_jsonl(path: Path) -> list[str]:
    prompts = []
    try:  # regular files only: a FIFO or /proc file would block the run before it starts
        lines = read_regular_file(path, MAX_PROMPTS_BYTES, "prompts file").decode("utf-8").splitlines()
    except FileRefused as exc:
        raise PromptError(str(exc)) from None
    except UnicodeDecodeError:
        raise PromptError(f"{path}: not UTF-8 text") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        except RecursionError:  # a line of 100,000 `[`
            raise PromptError(f"{path}:{number}: JSON nested too deeply") from None
        except ValueError as exc:  # e.g. an integer literal over Python's digit limit
            raise PromptError(f"{path}:{number}: unreadable JSON ({exc})") from None
        prompts.append(_prompt_text(item, f"{path}:{number}"))
    return prompts


def _prompt_text(item: object, where: str) -> str:
    if isinstance(item, str):
        text = item
    elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
        text = item["prompt"]
    elif isinstance(item, dict) and isinstance(item.get("text"), str):
        text = item["text"]
    elif isinstance(item, dict) and isinstance(item.get("turns"), list) and item["turns"]:
        text = item["turns"][0]
    else:
        raise PromptError(f"{where}: expected a string or an object with 'prompt', 'text' or 'turns'")
    if not isinstance(text, str) or not text:
        raise PromptError(f"{where}: empty prompt")
    return text
