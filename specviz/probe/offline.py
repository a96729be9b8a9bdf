"""Replay a probe's prompts through the server's engine, offline, so the watch can see inside.

    python -m specviz.probe.offline vllm --model PATH (--prompts FILE | --num-prompts N)
        --max-tokens M --max-num-seqs C [--focus 3,7] [SERVER FLAGS...]
    python -m specviz.probe.offline transformers --model PATH (...) --max-num-seqs C
        [--dtype D] [--cb-num-blocks B] [--cb-block-size S] [--cb-max-batch-tokens T]

Run it under `specviz watch --out T -- ...` (the command `specviz probe` prints for a suspect or
collapsed run). The same prompts (loaded exactly as the probe loaded them), greedy, the same
`max_tokens`, at most `--max-num-seqs` requests in one batch (the probe's concurrency: the server
never had more in flight from it), through `vllm.LLM` (the remaining flags are vLLM's own engine
flags, as given to the server) or transformers' continuous batching (`generate_batch`, with
`transformers serve`'s `--cb-*` settings). One JSON line per prompt on stdout: its index, token ids
and text; `--focus` marks the prompts the probe flagged.

What it can and cannot show: the batches here are formed by this process's scheduler from all the
prompts submitted at once, not by the server from requests arriving over HTTP, so a bug that
needs the server's exact batch composition or timing may not recur. Where it does recur, the
watch names the step and request; where it does not, the replay says nothing about the server.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specviz.errors import SpecvizError
from specviz.probe.prompts import Prompt, load_prompts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz.probe.offline", description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=["vllm", "transformers"])
    parser.add_argument("--model", required=True, help="the model the server serves (a local path)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompts", default=None, help="the probe's --prompts JSONL")
    source.add_argument("--num-prompts", type=int, default=None, help="the probe's --num-prompts (SpecBench)")
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True, help="requests in one batch at most")
    parser.add_argument("--focus", default="", help="prompt indices the probe flagged, e.g. 3,7")
    return parser


def _transformers_flags(rest: list[str]) -> argparse.Namespace:
    """`transformers serve`'s flags that shape continuous batching; anything else is refused."""
    parser = argparse.ArgumentParser(prog="transformers flags")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--cb-num-blocks", type=int, default=None)
    parser.add_argument("--cb-block-size", type=int, default=None)
    parser.add_argument("--cb-max-batch-tokens", type=int, default=None)
    return parser.parse_args(rest)


Answer = tuple[list[int], str]  # token ids, and the text the engine's own detokenizer makes of them


def run_vllm(model: str, texts: list[str], max_tokens: int, max_num_seqs: int, rest: list[str]) -> list[Answer]:
    """Greedy answers through `vllm.LLM`, built from the server's own flags (`rest`) with vLLM's
    own argument parser, so every flag means what it meant to the server."""
    import dataclasses

    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", model, "--max-num-seqs", str(max_num_seqs), *rest])
    engine = EngineArgs.from_cli_args(args)
    llm = LLM(**{f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)})
    params = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens)
    outputs = llm.generate(texts, params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outputs]


def run_transformers(model: str, texts: list[str], max_tokens: int, max_num_seqs: int, rest: list[str]) -> list[Answer]:
    """Greedy answers through transformers' continuous batching (`generate_batch`), with the
    server's `--cb-*` settings and at most `max_num_seqs` requests a forward."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, ContinuousBatchingConfig, GenerationConfig

    flags = _transformers_flags(rest)
    dtype: Any = "auto" if flags.dtype == "auto" else getattr(torch, flags.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model)
    target = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
    cb: dict[str, Any] = {"max_requests_per_batch": max_num_seqs, "use_cuda_graph": False}
    for key, value in (
        ("num_blocks", flags.cb_num_blocks),
        ("block_size", flags.cb_block_size),
        ("max_batch_tokens", flags.cb_max_batch_tokens),
    ):
        if value is not None:
            cb[key] = value
    config = GenerationConfig(
        max_new_tokens=max_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=0
    )
    inputs = [tokenizer(t)["input_ids"] for t in texts]
    with torch.no_grad():
        results = target.generate_batch(
            inputs=inputs, generation_config=config, continuous_batching_config=ContinuousBatchingConfig(**cb),
            warmup=False,
        )  # fmt: skip
    # one result per request id, "req_<n>" in submission order: sorted by n, not by finishing time
    ordered = sorted(results.items(), key=lambda item: int(str(item[0]).rsplit("_", 1)[-1]))
    answers = [list(r.generated_tokens) for _, r in ordered]
    return [(ids, tokenizer.decode(ids, skip_special_tokens=True)) for ids in answers]


def _prompts(args: argparse.Namespace) -> list[Prompt]:
    num = args.num_prompts if args.num_prompts is not None or args.prompts else 32
    return load_prompts(args.prompts, num)


def main(argv: list[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    try:
        prompts = _prompts(args)
    except (SpecvizError, OSError) as exc:  # the probe's own prompt errors: one line
        sys.stderr.write(f"specviz.probe.offline: {exc}\n")
        return 2
    focus = {int(x) for x in args.focus.split(",") if x.strip().isdigit()}
    texts = [p.as_text() for p in prompts]
    run = run_vllm if args.engine == "vllm" else run_transformers
    answers = run(args.model, texts, args.max_tokens, args.max_num_seqs, rest)
    for index, (ids, text) in enumerate(answers):
        line = {"index": index, "focus": index in focus, "token_ids": ids, "text": text}
        sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
