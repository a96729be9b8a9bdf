"""Model loading: every bad pair or path is a one-line ModelLoadError before any compute."""

from __future__ import annotations

import shutil

import pytest
from tiny import save_tiny_model_dirs

from specviz.engine.models import load_pair
from specviz.errors import ModelLoadError


def test_loads_a_good_pair(tiny_model_dirs) -> None:
    pair = load_pair(*tiny_model_dirs, device="cpu")
    assert pair.target.config.num_hidden_layers == 2 and pair.draft.config.num_hidden_layers == 1
    assert pair.eos_token_ids == [pair.tokenizer.eos_token_id]


def test_missing_path(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="no such model directory"):
        load_pair(str(tmp_path / "nope"), device="cpu")


def test_non_causal_model(tiny_model_dirs, tmp_path) -> None:
    from transformers import T5Config

    path = tmp_path / "t5"
    shutil.copytree(tiny_model_dirs[0], path)
    T5Config(vocab_size=300, d_model=16, num_layers=1, num_heads=2, d_kv=8, d_ff=32).save_pretrained(path)
    with pytest.raises(ModelLoadError, match="not a causal language model") as exc:
        load_pair(str(path), tiny_model_dirs[1], device="cpu")
    assert "\n" not in str(exc.value)


def test_different_vocabularies(tiny_model_dirs, tmp_path) -> None:
    other = save_tiny_model_dirs(tmp_path, corpus_shift=2)[1]
    with pytest.raises(ModelLoadError, match="different vocabularies"):
        load_pair(tiny_model_dirs[0], other, device="cpu")


def test_bad_device_and_dtype(tiny_model_dirs) -> None:
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_pair(*tiny_model_dirs, device="cpu", dtype="int3")
    with pytest.raises(ModelLoadError, match="unknown device"):
        load_pair(*tiny_model_dirs, device="tpu")
