"""The probe's prompts: a JSONL file (untrusted: one-line errors with line numbers, size limits)
or the first N vendored SpecBench questions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specviz.errors import PromptError
from specviz.files import FileRefused, read_regular_file

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_PROMPTS = 100_000
MAX_PROMPT_CHARS = 1_000_000
MAX_MESSAGES = 256
ROLES = ("system", "user", "assistant", "developer", "tool")


@dataclass(frozen=True)
class Prompt:
    """One request's input: `text` for /v1/completions or `messages` for /v1/chat/completions."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)

    def preview(self, limit: int = 200) -> str:
        text = self.text if self.text is not None else "\n".join(c for _, c in self.messages or ())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def as_text(self) -> str:
        """For /v1/completions: a chat prompt's contents, one per line."""
        return self.text if self.text is not None else "\n".join(c for _, c in self.messages or ()) + "\n"

    def as_messages(self) -> list[dict[str, str]]:
        """For /v1/chat/completions: a text prompt is one user message."""
        if self.messages is not None:
            return [{"role": r, "content": c} for r, c in self.messages]
        return [{"role": "user", "content": self.text or ""}]


def load_prompts(path: str | None, num_prompts: int | None) -> list[Prompt]:
    if num_prompts is not None and num_prompts < 1:
        raise PromptError("--num-prompts must be at least 1")
    if path is None:
        from specviz.data import load_specbench

        return [Prompt(text=p) for p in load_specbench()[:num_prompts]]
    prompts = read_prompts_file(Path(path))
    return prompts[:num_prompts] if num_prompts is not None else prompts


def read_prompts_file(path: Path) -> list[Prompt]:
    try:
        data = read_regular_file(path, MAX_FILE_BYTES, "prompts file")
    except FileRefused as exc:
        raise PromptError(str(exc)) from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise PromptError(f"{path}: not UTF-8 text") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(prompts) >= MAX_PROMPTS:
            raise PromptError(f"{path}:{number}: more than {MAX_PROMPTS} prompts")
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{where}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise PromptError(f"{where}: JSON nested too deeply") from None
        except ValueError as exc:
            raise PromptError(f"{where}: unreadable JSON ({exc})") from None
        prompts.append(_prompt(item, where))
    if not prompts:
        raise PromptError(f"{path}: no prompts in file")
    return prompts


def _prompt(item: object, where: str) -> Prompt:
    if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
        raise PromptError(f"{where}: expected an object with 'prompt' (a string) or 'messages' (a list)")
    if "prompt" in item:
        text = item["prompt"]
        if not isinstance(text, str) or not text:
            raise PromptError(f"{where}: 'prompt' must be a non-empty string")
        if len(text) > MAX_PROMPT_CHARS:
            raise PromptError(f"{where}: prompt of {len(text)} characters, over the {MAX_PROMPT_CHARS} limit")
        return Prompt(text=text)
    messages = item["messages"]
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{where}: 'messages' must be a non-empty list")
    if len(messages) > MAX_MESSAGES:
        raise PromptError(f"{where}: {len(messages)} messages, over the {MAX_MESSAGES} limit")
    out, total = [], 0
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise PromptError(f"{where}: messages[{n}] is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise PromptError(f"{where}: messages[{n}].role must be one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise PromptError(f"{where}: messages[{n}].content must be a string")
        total += len(content)
        if total > MAX_PROMPT_CHARS:
            raise PromptError(f"{where}: messages over the {MAX_PROMPT_CHARS} character limit")
        out.append((role, content))
    return Prompt(messages=tuple(out))
