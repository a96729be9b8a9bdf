"""A tiny OpenAI-compatible batching server for the probe's tests: the embedded default target.

    PYTHONPATH=$PWD python tests/support/probe_server.py   # prints "READY <port>" on stdout once it listens

One process serves every behaviour, chosen by the URL's first two path parts,
`/<mode>/<layout>/v1/completions` (and `/v1/chat/completions`, `/v1/models`, and `/<mode>/<layout>/metrics`):

- mode `identical`: every request decoded alone in float32 (answers never depend on the batch,
  though requests that arrive together are scheduled together: `collapse` sees the batch);
- mode `numerical`: requests that arrive together (within BATCH_WINDOW_S) are decoded as one
  left-padded batch in bfloat16, a lone request alone in float32: a batch changes the answers
  only through floating point;
- mode `bug`: `numerical`, plus a real batching bug: after the prompt, every row of a batch is fed
  the positions of the longest row (padded rows get positions shifted by their padding);
- mode `order`: `numerical`, plus a batch-order bug: from the third decode step on, the token fed
  back to each row is the previous row's (a slot mapping off by one after a reorder); each row
  still emits from its own logits, so its answer reads on, conditioned on a token it never chose;
- mode `mask`: `numerical`, plus a mild batch-order bug: at every decode step each row attends
  with the previous row's attention mask (a row of another length sees padding, or misses part
  of its prompt): every row is hit a little;
- layout `legacy` (`tokens` / `token_logprobs` / `top_logprobs`), `content`
  (`content[].top_logprobs`, also on completions) or `none` (logprobs ignored, as
  `transformers serve` does on completions).

Speculative serving is modelled on top of any mode by options joined with `+`
(`/numerical+spec+ph+llama/content/v1`):
- `spec`: the server drafts DRAFT_K tokens a step, each accepted with probability ACCEPT
  (decided by a seeded draw per prompt and position, so the same tokens draft the same way alone
  or batched), and reports it. The answers are the target's greedy tokens either way.
- `ph`: tokens that came from an accepted draft get placeholder logprobs (`0.0`, empty top
  list), as llama-server does.
- `rows`: a forward over several tokens of a request (its prompt) runs in bfloat16 even alone, as
  a quantized CPU server's matrix-matrix kernels round otherwise than its one-token decode;
- `verify`: llama.cpp's speculative server: every step after the prompt is a verify chunk
  (bfloat16, even alone) and every token after the first comes back as a placeholder (its server
  keeps no distribution for any token of a speculative step); implies `spec`.
- `collapse`: a row decoded in a batch of two or more accepts with probability COLLAPSED: the
  answers stay right, the acceptance falls (a batching bug in drafting).
- `deep`: in a batch of two or more, only draft positions 1 and after accept with probability
  COLLAPSED (position 0 keeps ACCEPT): a bug in the draft's later steps, which the overall rate
  shows less than the per-position counters (`/metrics` `..._per_pos_total`, SGLang's histogram).
- telemetry style: `llama` (`timings.draft_n` / `draft_n_accepted` / `predicted_n`, the default),
  `vllmreq` (`metrics.speculative_decoding` per request), `vllm` (only the Prometheus counters
  at `/metrics`), `sglang` (`meta_info.spec_verify_ct` / `completion_tokens`), `badtel`
  (llama style with more accepted than drafted: untrusted telemetry).
- `slot`: cross-slot contamination: in a batch of two or more, the request in the batch's second
  slot re-reads its previous position from its third token on (its answer repeats a token and
  lags one behind), whatever the others hold; copies of one prompt then split at token 3.
- `rare`: rare corruption: the RARE_AT-th request this URL mode answers in a batch of two or
  more gets the end-of-sequence token's text in place of its third token (a leaked special
  token), once per server process.

With PROBE_SERVER_KEY set, requests must carry `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import json
import os
import queue
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from specviz.engine.models import DEFAULT_TARGET

BATCH_WINDOW_S = 0.05  # requests arriving within this window of the first form one batch
MAX_BATCH = 16
MODES = ("identical", "numerical", "bug", "order", "mask")
LAYOUTS = ("legacy", "content", "none")
OPTIONS = (
    "spec",
    "ph",
    "rows",
    "verify",
    "collapse",
    "deep",
    "slot",
    "llama",
    "vllm",
    "vllmreq",
    "sglang",
    "badtel",
    "rare",
)
RARE_AT = 30  # with `rare`, the 30th request answered in a batch (per URL mode) is corrupted
DRAFT_K = 4  # tokens drafted per step
ACCEPT = 0.9  # a draft token's acceptance, alone or batched
COLLAPSED = 0.1  # ... in a batch, with `collapse`


# ---------------------------------------------------------------------------------------------
# Decoding: greedy, left-padded batches with explicit positions


class Decoder:
    """The target (a Llama) in plain torch: no transformers import, so the server starts in seconds.

    The same arithmetic as transformers' Llama (float32 RMSNorm, rotary embeddings computed in
    float32 and cast, SiLU MLP, tied embeddings); the replay test checks it against transformers.
    """

    def __init__(self, path: str) -> None:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        torch.set_num_threads(1)
        self.tokenizer = _Tokenizer(Tokenizer.from_file(str(Path(path) / "tokenizer.json")))
        config = json.loads((Path(path) / "config.json").read_text())
        weights = load_file(str(Path(path) / "model.safetensors"))
        self.f32 = _Llama(config, weights, torch.float32)
        self.bf16 = _Llama(config, weights, torch.bfloat16)
        self.eos = int(config["eos_token_id"])
        self.pad = int(config["pad_token_id"])

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], max_tokens: list[int], mode: str, top_k: int, rows: tuple[bool, bool]
    ) -> list[dict]:
        """Greedy continuations of `prompts` decoded together; per row its ids, logprobs and top-k.
        `rows`: (prompt, steps) forwards in bfloat16 even alone (options `rows`, `verify`)."""
        batched = len(prompts) > 1
        prompt_model = self.bf16 if (batched or rows[0]) and mode != "identical" else self.f32
        model = self.bf16 if (batched or rows[1]) and mode != "identical" else self.f32
        shift_bug = batched and mode == "bug"
        order_bug = batched and mode == "order"
        mask_bug = batched and mode == "mask"
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        # input_ids, mask: (B, width), left-padded
        ids = torch.tensor([[self.pad] * (width - n) + p for p, n in zip(prompts, lengths)])
        mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache: list = []
        logits = prompt_model(ids, mask, positions, cache)[:, -1, :]  # (B, vocab)
        rows = [{"ids": [], "logprobs": [], "top": []} for _ in prompts]
        done = [False] * len(prompts)
        limit = max(max_tokens)
        for step in range(limit):
            logprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, vocab)
            top_lp, top_id = logprobs.topk(max(top_k, 1), dim=-1)
            chosen = logprobs.argmax(-1)  # (B,)
            for r, row in enumerate(rows):
                if done[r]:
                    continue
                token = int(chosen[r])
                if token == self.eos:
                    done[r] = True
                    continue
                row["ids"].append(token)
                row["logprobs"].append(float(logprobs[r, token]))
                row["top"].append([(int(i), float(v)) for i, v in zip(top_id[r], top_lp[r])])
                if len(row["ids"]) >= max_tokens[r]:
                    done[r] = True
            if all(done) or step == limit - 1:
                break
            mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], dim=-1)
            if shift_bug:  # the bug: every row continues at the longest row's position
                step_pos = torch.full((len(prompts), 1), width + step)
            else:
                step_pos = torch.tensor([[n + step] for n in lengths])
            fed = chosen.roll(1, dims=0) if order_bug and step >= 2 else chosen  # the bug: another row's token
            seen = mask.roll(1, dims=0) if mask_bug else mask  # the bug: the previous row's attention mask
            logits = model(fed.view(-1, 1), seen, step_pos, cache)[:, -1, :]
        return rows


class _Tokenizer:
    """The two calls the server makes, as transformers' tokenizer answers them for this model."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": self.tokenizer.encode(text).ids}

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


class _Llama:
    """Llama forward with a KV cache: `cache` is a list (per layer) of (k, v), extended in place."""

    def __init__(self, config: dict, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        self.w = {k.removeprefix("model."): v.to(dtype) for k, v in weights.items()}
        self.dtype, self.layers = dtype, int(config["num_hidden_layers"])
        self.heads, self.kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
        self.head_dim = int(config.get("head_dim") or config["hidden_size"] // self.heads)
        self.eps = float(config["rms_norm_eps"])
        theta = float((config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 10000.0)))
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.lm_head = self.w.get("lm_head.weight", self.w["embed_tokens.weight"])

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(self.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: list) -> torch.Tensor:
        """Logits (B, T, vocab) of the new tokens `ids` (B, T); `mask` (B, past + T) marks real keys."""
        w, (b, t) = self.w, ids.shape
        freqs = positions.float()[..., None] * self.inv_freq  # (B, T, head_dim / 2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, head_dim)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        total = mask.shape[1]
        # (B, 1, T, total): causal over real keys; a padded query sees itself (no empty softmax row)
        query_at = torch.arange(total - t, total)[:, None]
        keys = torch.arange(total)[None, :]
        allowed = (keys <= query_at)[None] & mask.bool()[:, None, :]
        allowed = (allowed | (keys == query_at)[None])[:, None]
        x = w["embed_tokens.weight"][ids]
        for i in range(self.layers):
            p = f"layers.{i}."
            h = self._norm(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            if len(cache) > i:  # (a cache another dtype's forward wrote is read in this one's)
                k = torch.cat((cache[i][0].to(k.dtype), k), dim=2)
                v = torch.cat((cache[i][1].to(v.dtype), v), dim=2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            a = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, enable_gqa=self.heads != self.kv_heads
            )
            x = x + a.transpose(1, 2).reshape(b, t, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = self._norm(x, w[p + "post_attention_layernorm.weight"])
            gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        return self._norm(x, w["norm.weight"]) @ self.lm_head.T


# ---------------------------------------------------------------------------------------------
# Batching: one worker thread per mode gathers what arrives together


class Job:
    def __init__(self, prompt_ids: list[int], max_tokens: int, top_k: int, rows=(False, False)) -> None:
        self.prompt_ids, self.max_tokens, self.top_k, self.rows = prompt_ids, max_tokens, top_k, rows
        self.done = threading.Event()
        self.result: dict | None = None


class Batcher:
    def __init__(self, decoder: Decoder, mode: str, lock: threading.Lock) -> None:
        self.decoder, self.mode, self.lock = decoder, mode, lock
        self.jobs: queue.Queue[Job] = queue.Queue()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, job: Job) -> dict:
        self.jobs.put(job)
        job.done.wait()
        assert job.result is not None
        return job.result

    def _loop(self) -> None:
        while True:
            batch = [self.jobs.get()]
            deadline = time.monotonic() + BATCH_WINDOW_S
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.jobs.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            # `identical` schedules requests together (its drafting sees the batch) but decodes
            # each row alone: the answers never depend on the batch
            groups = [[j] for j in batch] if self.mode == "identical" else [batch]
            rows = []
            for group in groups:
                with self.lock:  # one forward at a time across modes: the tests share two cores
                    rows += self.decoder.generate(
                        [j.prompt_ids for j in group],
                        [j.max_tokens for j in group],
                        self.mode,
                        max(j.top_k for j in group),
                        (any(j.rows[0] for j in group), any(j.rows[1] for j in group)),
                    )
            for slot, row in enumerate(rows):
                row["batch"], row["slot"] = len(batch), slot
            for job, row in zip(batch, rows):
                job.result = row
                job.done.set()


# ---------------------------------------------------------------------------------------------
# Speculative drafting, simulated on the target's own tokens


def simulate_drafting(
    prompt_ids: list[int], ids: list[int], accept: float, deeper: float | None = None
) -> tuple[list[bool], dict]:
    """Which output tokens came from an accepted draft, and the counters a server would report.

    Token 0 comes from the prefill; then each step drafts DRAFT_K tokens, keeps the leading ones
    its seeded draws accept (position 0 with `accept`, later ones with `deeper`, default the
    same), and emits one token of the target's own. `histogram[n]`: steps that accepted n."""
    drafted_flags = [False] * len(ids)
    drafted = accepted = steps = 0
    histogram = [0] * (DRAFT_K + 1)
    pos = 1
    while pos < len(ids):
        k = min(DRAFT_K, len(ids) - pos)
        rng = random.Random(hash((tuple(prompt_ids), tuple(ids[:pos]))))
        m = 0
        while m < k and rng.random() < (accept if m == 0 or deeper is None else deeper):
            m += 1
        for j in range(pos, pos + m):
            drafted_flags[j] = True
        drafted, accepted, steps = drafted + k, accepted + m, steps + 1
        histogram[m] += 1
        pos += m + 1
    counts = {"drafted": drafted, "accepted": accepted, "steps": steps, "tokens": len(ids), "histogram": histogram}
    return drafted_flags, counts


def telemetry_fields(style: str, counts: dict) -> dict:
    """The response fields in which a server of `style` reports its drafting."""
    if style in ("llama", "badtel"):
        accepted = counts["drafted"] + 1 if style == "badtel" else counts["accepted"]
        timings = {"draft_n": counts["drafted"], "draft_n_accepted": accepted, "predicted_n": counts["tokens"]}
        return {"timings": timings}
    if style == "vllmreq":
        return {"metrics": {"speculative_decoding": {
            "num_draft_tokens": counts["drafted"], "num_accepted_draft_tokens": counts["accepted"],
            "num_spec_steps": counts["steps"]}}}  # fmt: skip
    if style == "sglang":
        meta = {"spec_verify_ct": counts["steps"], "completion_tokens": counts["tokens"]}
        return {"meta_info": {**meta, "spec_accept_histogram": counts["histogram"]}}
    return {}  # vllm: only the Prometheus counters


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP


def _logprobs_payload(
    decoder: Decoder, row: dict, top_k: int, layout: str, placeholders: list[bool] | None = None
) -> dict | None:
    if layout == "none" or top_k <= 0:
        return None
    text = [decoder.tokenizer.decode([i]) for i in row["ids"]]
    tops = [[(decoder.tokenizer.decode([i]), v) for i, v in top[:top_k]] for top in row["top"]]
    if placeholders:  # llama-server's stand-in for a drafted token: logprob 0.0, no alternatives
        row = dict(row, logprobs=[0.0 if ph else lp for lp, ph in zip(row["logprobs"], placeholders)])
        tops = [[] if ph else top for top, ph in zip(tops, placeholders)]
    if layout == "legacy":
        return {
            "tokens": text,
            "token_logprobs": row["logprobs"],
            "top_logprobs": [dict(t) if t else None for t in tops],
            "text_offset": [],
        }
    return {
        "content": [
            {
                "token": t,
                "logprob": lp,
                "bytes": list(t.encode()),
                "top_logprobs": [{"token": s, "logprob": v} for s, v in top],
            }
            for t, lp, top in zip(text, row["logprobs"], tops)
        ]
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the probe reuses its connections
    server: Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> tuple[str, str, str] | None:
        parts = self.path.strip("/").split("/")
        base, *options = parts[0].split("+")
        metrics = len(parts) == 3 and parts[2] == "metrics"
        if (
            not (metrics or (len(parts) >= 4 and parts[2] == "v1"))
            or base not in MODES
            or parts[1] not in LAYOUTS
            or not set(options) <= set(OPTIONS)
        ):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return None
        key = os.environ.get("PROBE_SERVER_KEY")
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._send(401, {"error": {"message": "bad api key"}})
            return None
        return parts[0], parts[1], "metrics" if metrics else "/".join(parts[3:])

    def do_GET(self) -> None:
        route = self._route()
        if route is None:
            return
        if route[2] == "metrics":
            counts = self.server.counters.get(route[0], {"drafted": 0, "accepted": 0, "steps": 0})
            histogram = self.server.histograms.get(route[0], [0] * (DRAFT_K + 1))
            body = "".join(
                f"# TYPE vllm:spec_decode_num_{name}_total counter\n"
                f'vllm:spec_decode_num_{name}_total{{model_name="tiny-target"}} {float(counts[key])}\n'
                for name, key in (("draft_tokens", "drafted"), ("accepted_tokens", "accepted"), ("drafts", "steps"))
            )
            body += "".join(  # as vLLM: rounds accepted through each draft position
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="tiny-target",position="{i}"}} '
                f"{float(sum(histogram[i + 1 :]))}\n"
                for i in range(DRAFT_K)
            )
            body = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif route[2] == "models":
            self._send(200, {"object": "list", "data": [{"id": "tiny-target", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        route = self._route()
        if route is None:
            return
        mode, layout, endpoint = route
        length = int(self.headers.get("Content-Length", "0"))
        request = json.loads(self.rfile.read(length))
        if endpoint == "completions":
            prompt = request["prompt"]
            top_k = int(request.get("logprobs") or 0)
        elif endpoint == "chat/completions":
            prompt = "\n".join(m["content"] for m in request["messages"]) + "\n"
            top_k = int(request.get("top_logprobs") or 0) if request.get("logprobs") else 0
        else:
            self._send(404, {"error": {"message": "not found"}})
            return
        decoder = self.server.decoder
        base, *options = mode.split("+")
        prompt_ids = decoder.tokenizer(prompt)["input_ids"]
        verify = "verify" in options
        rows = ("rows" in options or verify, verify)
        row = self.server.batchers[base].submit(Job(prompt_ids, int(request.get("max_tokens", 16)), top_k, rows))
        if "rare" in options and row["batch"] > 1 and self.server.count(mode + "/rare") == RARE_AT:
            ids = list(row["ids"])
            ids[min(2, len(ids) - 1)] = decoder.eos
            row = dict(row, ids=ids)
        if "slot" in options and row["batch"] > 1 and row["slot"] == 1 and len(row["ids"]) > 3:
            row = dict(row, ids=[*row["ids"][:3], *row["ids"][2:-1]])
        text = decoder.tokenizer.decode(row["ids"])
        extra: dict = {}
        placeholders = None
        if "spec" in options or verify:
            batched = row["batch"] > 1
            accept = COLLAPSED if "collapse" in options and batched else ACCEPT
            deeper = COLLAPSED if "deep" in options and batched else None
            flags, counts = simulate_drafting(prompt_ids, row["ids"], accept, deeper)
            placeholders = flags if "ph" in options else None
            if verify:  # llama.cpp: no logprob for any token of a speculative step
                placeholders = [j > 0 for j in range(len(row["ids"]))]
            style = next((o for o in options if o in ("llama", "vllm", "vllmreq", "sglang", "badtel")), "llama")
            extra = telemetry_fields(style, counts)
            with self.server.lock:
                total = self.server.counters.setdefault(mode, {"drafted": 0, "accepted": 0, "steps": 0})
                for key in total:
                    total[key] += counts[key]
                histogram = self.server.histograms.setdefault(mode, [0] * (DRAFT_K + 1))
                for n, h in enumerate(counts["histogram"]):
                    histogram[n] += h
        logprobs = _logprobs_payload(decoder, row, top_k, layout, placeholders)
        finish = "length" if len(row["ids"]) >= int(request.get("max_tokens", 16)) else "stop"
        if endpoint == "completions":
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs}
            choice["finish_reason"] = finish
        payload = {"id": "cmpl-0", "object": "text_completion", "model": "tiny-target", "choices": [choice]}
        self._send(200, {**payload, **extra})


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, decoder: Decoder) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.decoder = decoder
        lock = threading.Lock()
        self.batchers = {mode: Batcher(decoder, mode, lock) for mode in MODES}
        self.counters: dict[str, dict[str, int]] = {}  # per URL mode: the Prometheus counters
        self.histograms: dict[str, list[int]] = {}  # per URL mode: steps that accepted n drafts
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}

    def count(self, key: str) -> int:
        """How many times `key` was counted, this one included."""
        with self.lock:
            self.seen[key] = self.seen.get(key, 0) + 1
            return self.seen[key]


def main() -> None:
    server = Server(Decoder(os.environ.get("PROBE_SERVER_MODEL", DEFAULT_TARGET)))
    print(f"READY {server.server_address[1]}", flush=True)  # the readiness handshake
    server.serve_forever()


if __name__ == "__main__":
    main()
