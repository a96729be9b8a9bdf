"""An offline vLLM script as a user writes it (no specviz in it): 8 ragged greedy prompts, two of
equal length, one stopped early by its own max_tokens. `python offline_script.py METHOD` with
METHOD none, ngram or draft_model. The tests run it under `specviz watch --`."""

import os
import sys
from pathlib import Path

from vllm import LLM, SamplingParams

ASSETS = Path(__file__).resolve().parents[2] / "specviz" / "assets"
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fib(n):",
    "1, 2, 3, 4,",
    "The quick brown fox jumps over the lazy dog and",
    "Hello",
    "Why is the sky",
    "A B C D",
]
SPECULATION = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    "draft_model": {"method": "draft_model", "model": str(ASSETS / "default-draft"), "num_speculative_tokens": 3},
}


def main(method: str) -> None:
    llm = LLM(
        model=str(ASSETS / "default-target"),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        max_num_seqs=8,
        kv_cache_memory_bytes=int(os.environ.get("KV_BYTES", 64 << 20)),
        speculative_config=SPECULATION[method],
    )
    params = [SamplingParams(temperature=0, max_tokens=7 if i == 3 else 24) for i in range(len(PROMPTS))]
    for out in llm.generate(PROMPTS, params, use_tqdm=False):
        print(out.request_id, out.outputs[0].text.replace("\n", " ")[:60])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "draft_model")
