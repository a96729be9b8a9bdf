"""Loading a target/draft pair that shares one tokenizer, with clear errors before any compute."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specviz.errors import ModelLoadError, first_line

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_TARGET = str(ASSETS / "default-target")
DEFAULT_DRAFT = str(ASSETS / "default-draft")
DEFAULT_HEAD = str(ASSETS / "default-head")  # an EAGLE-style head for the default target (proposers/head.py)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
}


@dataclass
class ModelPair:
    target: Any  # a transformers PreTrainedModel (causal LM)
    draft: Any | None
    tokenizer: Any
    target_name: str
    draft_name: str | None
    eos_token_ids: list[int]
    pad_token_id: int
    device: torch.device
    dtype: torch.dtype
    head: Any | None = None  # a draft head on the target's hidden states (`EagleHead`); loaded on demand


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda asked for, but no CUDA device is available")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ModelLoadError(f"unknown device {device!r}; use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """float32 on CPU (exactness tests need it), bfloat16 on CUDA, unless asked otherwise."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPES))}")
    return DTYPES[dtype]


def _is_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def load_tokenizer(name: str, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    if _is_local(name) and not Path(name).expanduser().exists():
        raise ModelLoadError(f"{name}: no such model directory")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types; the user needs one line
        raise ModelLoadError(f"{name}: cannot load tokenizer ({first_line(exc)})") from None


def check_same_vocabulary(target_tok: Any, draft_tok: Any, target: str, draft: str) -> None:
    """Speculative decoding compares token IDs, so both models must use one vocabulary."""
    target_vocab = target_tok.get_vocab()
    draft_vocab = draft_tok.get_vocab()
    if target_vocab != draft_vocab:
        only_t = len(target_vocab.keys() - draft_vocab.keys())
        only_d = len(draft_vocab.keys() - target_vocab.keys())
        raise ModelLoadError(
            f"target {target} and draft {draft} have different vocabularies "
            f"({len(target_vocab)} vs {len(draft_vocab)} tokens, {only_t} only in the target, "
            f"{only_d} only in the draft); speculative decoding needs one shared tokenizer"
        )


def load_causal_lm(name: str, device: torch.device, dtype: torch.dtype, trust_remote_code: bool = False) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars say what is happening

    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(f"{name}: cannot read model config ({first_line(exc)})") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        if "Unrecognized configuration" in str(exc) or "AutoModelForCausalLM" in str(exc):
            raise ModelLoadError(f"{name}: {config.model_type!r} is not a causal language model") from None
        raise ModelLoadError(f"{name}: cannot load model ({first_line(exc)})") from None
    except Exception as exc:
        raise ModelLoadError(f"{name}: cannot load model ({first_line(exc)})") from None
    try:
        model.to(device)
    except torch.OutOfMemoryError:
        raise ModelLoadError(f"{name}: out of memory moving the model to {device}") from None
    model.eval()
    return model


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every EOS the generation config names counts, plus the tokenizer's own."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    raw = getattr(gen, "eos_token_id", None) if gen is not None else None
    if raw is None:
        raw = getattr(model.config, "eos_token_id", None)
    if isinstance(raw, int):
        ids.add(raw)
    elif isinstance(raw, (list, tuple)):
        ids.update(int(i) for i in raw)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def load_pair(
    target: str | None = None,
    draft: str | None = None,
    *,
    device: str = "auto",
    dtype: str | None = None,
    with_draft: bool = True,
    trust_remote_code: bool = False,
) -> ModelPair:
    """Load tokenizers first and compare vocabularies, so a bad pair fails before any weights."""
    target = target or DEFAULT_TARGET
    draft = (draft or DEFAULT_DRAFT) if with_draft else None
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    tokenizer = load_tokenizer(target, trust_remote_code)
    if draft is not None:
        draft_tokenizer = load_tokenizer(draft, trust_remote_code)
        check_same_vocabulary(tokenizer, draft_tokenizer, target, draft)
    target_model = load_causal_lm(target, torch_device, torch_dtype, trust_remote_code)
    draft_model = load_causal_lm(draft, torch_device, torch_dtype, trust_remote_code) if draft else None
    eos = eos_ids(target_model, tokenizer)
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = eos[0] if eos else 0
    return ModelPair(
        target=target_model,
        draft=draft_model,
        tokenizer=tokenizer,
        target_name=target,
        draft_name=draft,
        eos_token_ids=eos,
        pad_token_id=int(pad),
        device=torch_device,
        dtype=torch_dtype,
    )
