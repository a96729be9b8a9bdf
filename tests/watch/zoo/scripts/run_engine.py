"""Run one production-shaped zoo engine as an unmodified script, for `specviz watch --`:

    PYTHONPATH=tests/watch python -m specviz watch --out run.trace.json -- \
        python tests/watch/zoo/scripts/run_engine.py \
        packed --bug kv_leak --prompts '[[5, 6, 7], [11, 12]]' --budgets 10,4

It builds the tiny Llama target (and, for the engines that use one, its noisy draft) with
`from_config`, as `tests/support/tiny.make_pair` does, so the command's hooks see them (`--family
F`: that family's tiny pair from `tiny` itself, tests/support then on the path too); the head
engine builds its head (no draft model; `--set medusa=1`: Medusa-shaped heads), `medusa_embeds`
casts the target to bfloat16 and builds its Medusa heads, the mtp engine
attaches its in-forward head to the target (`--set half=1`: in float16); `tree --set head=1` has a
draft head propose the trees. It prints
`OUTS <outputs>` and `EVENTS <bug locations>` for the tests to read (`--decode outputs|full`: first
it decodes its outputs, or each prompt with its output, through a word-level tokenizer it builds,
as a script that prints its outputs does). Nothing in it knows about specviz.
"""

from __future__ import annotations

import argparse
import json

import torch
import transformers as tf
from zoo import (  # tests/watch on the path (pytest's pythonpath, or PYTHONPATH)
    chunked,
    chunkmix,
    dropping,
    head,
    holes,
    medusa_embeds,
    mtp,
    packed,
    paged,
    queued,
    sampled,
    slots,
    slots2,
    tree,
)

ENGINES = {"dropping": dropping, "packed": packed, "queued": queued, "paged": paged, "head": head, "tree": tree}
ENGINES["mtp"] = mtp
ENGINES["chunked"] = chunked
ENGINES["chunkmix"] = chunkmix
ENGINES["slots"] = slots
ENGINES["slots2"] = slots2
ENGINES["medusa_embeds"] = medusa_embeds
ENGINES["holes"] = holes  # a batch that never moves a slot: rejected KV masked out as holes
ENGINES["sampled"] = sampled  # rejection sampling; `--set temperature_pct=N`: T = N / 100
USES_DRAFT = {"dropping", "packed", "queued", "tree", "slots", "slots2", "sampled", "holes"}


def tiny_llama() -> torch.nn.Module:
    config = tf.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    return tf.AutoModelForCausalLM.from_config(config).float().eval()


def noisy_copy(target: torch.nn.Module) -> torch.nn.Module:
    draft = tiny_llama()
    draft.load_state_dict(target.state_dict())
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in draft.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn(param.shape, generator=gen) * param.std() * 0.15)
    return draft


def tiny_tokenizer() -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny models' 96 ids, built in-process (no download)."""
    from tokenizers import Tokenizer, models

    vocab = {f"w{i}": i for i in range(96)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w3"))
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0", eos_token="w1", unk_token="w3")


def decode(how: str, prompts: list[list[int]], outs: list[list[int]]) -> list[str]:
    """The script's last act: its outputs as text (`full`: each after its prompt), one batch."""
    batch = [(prompt if how == "full" else []) + out for prompt, out in zip(prompts, outs)]
    return tiny_tokenizer().batch_decode(batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("--bug")
    parser.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    parser.add_argument("--budgets", required=True, help="one max_new_tokens, or one per prompt, comma-separated")
    parser.add_argument("--family", help="a tiny pair of this family (tests/support/tiny.make_pair) instead")
    parser.add_argument("--embedded", action="store_true", help="specviz's embedded trained pair (no download)")
    parser.add_argument("--decode", choices=["outputs", "full"], help="decode the outputs before printing them")
    parser.add_argument("--set", action="append", default=[], help="NAME=INT: an engine option (e.g. tokens=5)")
    args = parser.parse_args()
    options: dict = {name: int(value) for name, value in (item.split("=", 1) for item in args.set)}
    if "temperature_pct" in options:  # the options are integers; a sampler's temperature is not
        options["temperature"] = options.pop("temperature_pct") / 100
    prompts = json.loads(args.prompts)
    budgets = [int(n) for n in args.budgets.split(",")]
    max_new = budgets[0] if len(budgets) == 1 else budgets
    torch.manual_seed(0)
    embedded = None
    if args.embedded:  # a trained pair: it predicts text prompts, so its choices often repeat them
        from specviz.engine.models import load_pair

        embedded = load_pair(device="cpu")
        target = embedded.target
    elif args.family:
        import tiny  # tests/support: on pytest's pythonpath, or PYTHONPATH

        target = tiny.build(args.family, 3)
    else:
        target = tiny_llama()
    if args.engine == "tree" and options.get("head"):  # a draft head proposes the trees (no draft model)
        second = head.DraftHead(target)
    elif embedded is not None and args.engine in USES_DRAFT:
        second = embedded.draft
    elif args.family and args.engine in USES_DRAFT:
        second = tiny.noisy_draft(target)
    elif args.engine in USES_DRAFT:
        second = noisy_copy(target)
    elif args.engine == "head":
        second = head.MedusaHeads(target) if options.pop("medusa", 0) else head.DraftHead(target)
    elif args.engine == "medusa_embeds":  # a bfloat16 target fed inputs_embeds, Medusa heads
        target = target.to(medusa_embeds.DTYPE)
        second = medusa_embeds.Heads(target, options.get("k", 2))  # one head per draft depth
    else:
        second = None
    if args.engine == "mtp":  # the head is the target's own module: no second model
        dtype = torch.float16 if options.pop("half", 0) else torch.float32
        outs, events = mtp.generate(target, prompts, max_new, bug=args.bug, dtype=dtype, **options)
    else:
        outs, events = ENGINES[args.engine].generate(target, second, prompts, max_new, bug=args.bug, **options)
    if args.decode:
        decode(args.decode, prompts, outs)
    print("OUTS", json.dumps(outs))
    print("EVENTS", json.dumps(events))


if __name__ == "__main__":
    main()
