"""Tiny random-weight model pairs and a toy tokenizer for fast engine tests (no downloads).

The draft is a noisy copy of the target, so it agrees often but not always: batches go ragged.
"""

from __future__ import annotations

import copy

import torch

from specviz.engine.models import ModelPair

VOCAB = 96
FAMILIES = ("llama", "gpt2", "gpt_neox", "opt")
# Different attention details: biases (qwen2), query/key norms (qwen3, olmo2), soft-capping and
# mixed sliding/full layers (gemma2), mixture-of-experts layers (mixtral, qwen2_moe).
MORE_FAMILIES = ("qwen2", "qwen3", "olmo2", "gemma2", "mixtral", "qwen2_moe")
# Families with sliding-window layers, built with a window the test runs go past.
WINDOW_FAMILIES = ("mistral", "gemma3", "gemma2", "qwen2", "starcoder2")


class ToyTokenizer:
    """Characters to ids 3..95; pad and eos ids are configurable (they may be equal)."""

    def __init__(self, pad_token_id: int = 0, eos_token_id: int = 1) -> None:
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [3 + (ord(c) % (VOCAB - 3)) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(32 + (i % 90)) for i in ids)

    def get_vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(VOCAB)}


def _config(family: str, layers: int, hidden: int, window: int | None = None):
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    if family in _MORE:
        return _MORE[family](tf, layers, hidden, window, common)
    if family == "llama":
        return tf.LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            **common,
        )
    if family == "gpt2":
        return tf.GPT2Config(
            n_embd=hidden, n_layer=layers, n_head=4, n_positions=512, tie_word_embeddings=False, **common
        )
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            max_position_embeddings=512,
            rotary_pct=0.5,
            **common,
        )
    if family == "opt":
        return tf.OPTConfig(
            hidden_size=hidden,
            ffn_dim=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            max_position_embeddings=512,
            word_embed_proj_dim=hidden,
            tie_word_embeddings=False,
            **common,
        )
    raise ValueError(family)


def _llama_like(hidden: int, layers: int) -> dict:
    return dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )


def _alternating(layers: int) -> list[str]:
    """Sliding first, then full, alternating (Gemma 2's pattern)."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


# family -> (transformers module, layers, hidden, window or None, common kwargs) -> config
_MORE = {
    "qwen2": lambda tf, n, h, w, c: tf.Qwen2Config(
        **_llama_like(h, n), use_sliding_window=w is not None, sliding_window=w, max_window_layers=1, **c
    ),
    "qwen3": lambda tf, n, h, w, c: tf.Qwen3Config(**_llama_like(h, n), head_dim=16, **c),
    "olmo2": lambda tf, n, h, w, c: tf.Olmo2Config(**_llama_like(h, n), **c),
    "gemma2": lambda tf, n, h, w, c: tf.Gemma2Config(
        **_llama_like(h, n),
        head_dim=16,
        sliding_window=w or 4096,
        layer_types=_alternating(n),
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
        **c,
    ),
    "gemma3": lambda tf, n, h, w, c: tf.Gemma3TextConfig(
        **_llama_like(h, n), head_dim=16, sliding_window=w or 4096, layer_types=_alternating(n), **c
    ),
    "mixtral": lambda tf, n, h, w, c: tf.MixtralConfig(
        **_llama_like(h, n), num_local_experts=4, num_experts_per_tok=2, sliding_window=w, **c
    ),
    "qwen2_moe": lambda tf, n, h, w, c: tf.Qwen2MoeConfig(
        **_llama_like(h, n),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=h,
        shared_expert_intermediate_size=h,
        **c,
    ),
    "mistral": lambda tf, n, h, w, c: tf.MistralConfig(**_llama_like(h, n), sliding_window=w, **c),
    "starcoder2": lambda tf, n, h, w, c: tf.Starcoder2Config(**_llama_like(h, n), sliding_window=w, use_bias=True, **c),
}


def build(family: str, layers: int, hidden: int = 64, seed: int = 0, window: int | None = None) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(family, layers, hidden, window))
    return model.float().eval()


def noisy_draft(target: torch.nn.Module, alpha: float = 0.15, seed: int = 7) -> torch.nn.Module:
    """A copy of the target with Gaussian noise (alpha x each matrix's std) on every matrix.

    Agreement with the target is ~0.6 per token at alpha 0.15 for all four families, so some
    rows accept everything while others accept nothing: the batch goes ragged.
    """
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn(param.shape, generator=gen) * param.std() * alpha)
    return draft.eval()


def make_pair(family: str = "llama", eos: int = 1, pad: int = 0, seed: int = 0, window: int | None = None) -> ModelPair:
    target = build(family, 3, seed=seed, window=window)
    draft = noisy_draft(target)
    return ModelPair(
        target=target,
        draft=draft,
        tokenizer=ToyTokenizer(pad, eos),
        target_name=f"tiny-{family}" + (f"-window{window}" if window else ""),
        draft_name=f"tiny-{family}-draft",
        eos_token_ids=[eos],
        pad_token_id=pad,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


def save_tiny_model_dirs(root, seed: int = 0, corpus_shift: int = 0) -> tuple[str, str]:
    """A real HF tokenizer + tiny Llama target/draft saved as model directories under `root`.

    `corpus_shift` trains the tokenizer on other text, giving a different vocabulary.
    """
    from pathlib import Path

    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = Path(root)
    words = ["speculative", "decoding", "batch", "ragged", "tensor", "cache", "position", "mask"]
    corpus = [
        " ".join(words[(i + j + corpus_shift) % len(words)] * (1 + corpus_shift) for j in range(12)) for i in range(40)
    ]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=300 + 7 * corpus_shift, special_tokens=["<|endoftext|>", "<pad>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", pad_token="<pad>")
    paths = []
    for name, layers in (("target", 2), ("draft", 1)):
        torch.manual_seed(seed + layers)
        cfg = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            bos_token_id=None,
        )
        model = LlamaForCausalLM(cfg)
        path = root / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]
