"""kit.llama served in process to the course's load generator, and its memory figures, labelled by where they
were taken (weeks 15-18).

    model = Llama.from_checkpoint("ckpt", device="cuda", dtype=torch.bfloat16)
    engine = Engine(model)
    rows = run_matrix(cells, "results/", send=engine.send)    # kit.load_matrix, every cell through the engine
    engine.memory()   # {"source": "device" | "cpu-stand-in", ...}: what the figures are, said in every figure
    phase_times(model, prompt_lens=[64, 256], batch_sizes=[1, 8])   # prefill and decode, with their formulas

The engine is the simplest correct server: one request at a time, first come first served, batch 1, a fresh
contiguous cache per request (prefill once, then one decode step per token). Week 17's continuous batching and
paged pool are what beat it. The model runs in a worker thread, so arrivals keep their clock while it computes.
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import AsyncIterator, Awaitable

import torch

from infracourse.kit.hf_checkpoint import LlamaConfig, expected_tensors
from infracourse.kit.llama import Llama
from infracourse.kit.loadgen import RequestRecord, RequestSpec, record_stream


class OneAtATime:
    """A server of one request at a time, first come first served, the others queued: `stream(spec)` yields a
    request's tokens as text ("17 ") inside `async with self._queue()`; `send` is kit.loadgen.run_load's."""
    _loop = _lock = None

    def _queue(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()  # each run_load has its own event loop; a lock belongs to one
        if self._loop is not loop:
            self._loop, self._lock = loop, asyncio.Lock()
        return self._lock

    def stream(self, spec: RequestSpec) -> AsyncIterator[str]:
        raise NotImplementedError

    def send(self, spec: RequestSpec) -> Awaitable[RequestRecord]:
        """run_load's `send`: the request's record, on the same clock rules as an HTTP request's."""
        return record_stream(spec, self.stream(spec))


class Engine(OneAtATime):
    def __init__(self, model: Llama):
        self.model = model
        self.peak_kv_bytes = 0  # the largest cache held at once (one request at a time: the largest cache)

    @torch.no_grad()
    def _next(self, ids: torch.Tensor, cache) -> int:
        return int(self.model(ids, cache)[0, -1].argmax())

    async def stream(self, spec: RequestSpec) -> AsyncIterator[str]:
        """The greedy tokens of one request as they are produced, each as its id in text ("17 ")."""
        async with self._queue():
            cache = self.model.new_cache(1, len(spec.prompt_ids) + spec.max_tokens)
            self.peak_kv_bytes = max(self.peak_kv_bytes, cache.nbytes)
            ids = torch.tensor([spec.prompt_ids], device=self.model.device)
            for _ in range(spec.max_tokens):
                token = await asyncio.to_thread(self._next, ids, cache)  # prefill at step 0, then decode
                yield f"{token} "
                ids = torch.tensor([[token]], device=self.model.device)

    def memory(self) -> dict:
        """Memory figures and what they are. On CUDA: device memory (torch.cuda.max_memory_allocated since the
        last reset, the weights' and the largest KV cache's bytes). On a CPU the process's resident size stands
        in for device memory and says so: `source` is "cpu-stand-in"."""
        weights = sum(t.nbytes for t in {p.data_ptr(): p for p in self.model.parameters()}.values())
        figures = {"weights_bytes": weights, "kv_peak_bytes": self.peak_kv_bytes,
                   "kv_bytes_per_token": self.model.cfg.kv_bytes_per_token(self.model.dtype),
                   "dtype": str(self.model.dtype).removeprefix("torch.")}
        device = self.model.device
        if device.type == "cuda":
            return {"source": "device", "device": torch.cuda.get_device_name(device),
                    "measure": "torch.cuda.max_memory_allocated",
                    "memory_bytes": torch.cuda.max_memory_allocated(device), **figures}
        import psutil

        return {"source": "cpu-stand-in", "device": "cpu", "measure": "process resident size (psutil), standing "
                "in for device memory", "memory_bytes": psutil.Process().memory_info().rss, **figures}


# Prefill and decode, measured beside their formulas ----------------------------------------------------------
def decode_flops(cfg: LlamaConfig, batch: int, context: int) -> int:
    """FLOPs of one decode step: `batch` sequences, one new token each, attending to `context` keys (its own
    included). 2 per multiply-add: every projection and the LM head once per token, plus Q.K and A.V over the
    context (2 x heads x head_dim x context each) per layer."""
    hd, C = cfg.head_dim, cfg.hidden
    per_layer = 2 * C * cfg.heads * hd + 2 * C * cfg.kv_heads * hd + 3 * C * cfg.intermediate
    matmul = cfg.layers * per_layer + C * cfg.vocab
    return 2 * batch * matmul + cfg.layers * 4 * batch * cfg.heads * hd * context


def decode_bytes(cfg: LlamaConfig, batch: int, context: int, dtype: torch.dtype) -> int:
    """The least a decode step reads: every weight once (the embedding table only as the LM head, when tied: a
    lookup reads `batch` rows of it) and the batch's cached keys and values."""
    numel = sum(math.prod(s) for n, s in expected_tensors(cfg).items()
                if n != "model.embed_tokens.weight" or cfg.tie_embeddings)
    return numel * dtype.itemsize + batch * context * cfg.kv_bytes_per_token(dtype)


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the clock stops when the device is done, not when the launch returns


@torch.no_grad()
def phase_times(model: Llama, prompt_lens, batch_sizes, *, new_tokens: int = 8, repeats: int = 3,
                seed: int = 0) -> list[dict]:
    """Prefill and decode timed at every (batch, prompt length): the fastest of `repeats`, each from an empty
    cache on fresh random prompts. prefill_ms = the prompt's forward (time to the first token's logits);
    decode_ms_per_step = the mean of the following new_tokens - 1 single-token steps (each a batch of tokens).
    Beside each: decode FLOPs and bytes at the mean context and their ratio (FLOPs per byte), which says on a
    given device whether decode is bound by memory bandwidth (below the device's FLOPs/bandwidth ratio) or by
    compute."""
    if new_tokens < 2 or repeats < 1:
        raise ValueError(f"new_tokens >= 2 (a decode step to time) and repeats >= 1, got {new_tokens}, {repeats}")
    gen = torch.Generator().manual_seed(seed)
    device, dtype, cfg = model.device, model.dtype, model.cfg
    rows = []
    for batch in batch_sizes:
        for prompt_len in prompt_lens:
            best_prefill = best_decode = math.inf
            for round_ in range(repeats + 1):  # round 0 warms up and is not counted
                ids = torch.randint(cfg.vocab, (batch, prompt_len), generator=gen).to(device)
                cache = model.new_cache(batch, prompt_len + new_tokens)
                _sync(device)
                t0 = time.perf_counter()
                nxt = model(ids, cache)[:, -1:].argmax(-1)
                _sync(device)
                t1 = time.perf_counter()
                for _ in range(new_tokens - 1):
                    nxt = model(nxt, cache)[:, -1:].argmax(-1)
                _sync(device)
                t2 = time.perf_counter()
                if round_:
                    best_prefill = min(best_prefill, t1 - t0)
                    best_decode = min(best_decode, (t2 - t1) / (new_tokens - 1))
            context = prompt_len + new_tokens // 2
            flops, read = decode_flops(cfg, batch, context), decode_bytes(cfg, batch, context, dtype)
            rows.append({"batch": batch, "prompt": prompt_len, "new_tokens": new_tokens,
                         "prefill_ms": best_prefill * 1e3, "decode_ms_per_step": best_decode * 1e3,
                         "decode_tokens_per_s": batch / best_decode, "kv_cache_bytes": cache.nbytes,
                         "decode_flops": flops, "decode_bytes": read, "flops_per_byte": flops / read,
                         "device": str(device), "dtype": str(dtype).removeprefix("torch.")})
    return rows


# A learner's generate as a timed call (weeks 15-16: the judge clocks it with grading.perf.timed) ---------------
class prompt_batches:  # noqa: N801  (named like the factory it is, for BuildInWorker targets)
    """args(i) = ((batch, length) int64 prompt ids,): call i's prompts, drawn from a generator seeded with
    (seed, i), the same bits in the worker and the judge. On the host: a generate takes Python token lists."""

    def __init__(self, vocab: int, batch: int, length: int, seed: int = 0):
        self.vocab, self.batch, self.length, self.seed = vocab, batch, length, seed

    def __call__(self, index: int) -> tuple[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return (torch.randint(self.vocab, (self.batch, self.length), generator=gen),)


class GenerateCall:
    """generate(model, prompts, new_tokens) of a week-15 cache, called as a timed function of its prompts:
    batch 1 passes one list of ids, a batch the list of B equal-length lists. Returns the new tokens, one list
    per sequence, whatever the generate returned them as (the judge checks them)."""

    def __init__(self, generate, model, new_tokens: int):
        self.generate, self.model, self.new_tokens = generate, model, new_tokens

    def __call__(self, prompts: torch.Tensor):
        ids = prompts.tolist()
        out = self.generate(self.model, ids[0] if len(ids) == 1 else ids, self.new_tokens)
        tokens = out[0] if isinstance(out, tuple) and out else out
        return [tokens] if len(ids) == 1 else tokens


def reset_device_peak() -> int:
    """In the process that serves: empty the caching allocator and start torch.cuda.max_memory_allocated
    afresh; returns the bytes allocated now (the weights, whatever else is alive)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def device_peak() -> dict:
    """{"max_allocated", "allocated"} bytes of this process's CUDA allocator since reset_device_peak."""
    torch.cuda.synchronize()
    return {"max_allocated": torch.cuda.max_memory_allocated(), "allocated": torch.cuda.memory_allocated()}


def greedy_mismatch(model, prompts: torch.Tensor, tokens, n: int, tol: float) -> str | None:
    """Judge side: None when `tokens` (B lists of n ints) are a greedy continuation of `prompts` (B, T) under
    `model`: one teacher-forced forward over prompt + tokens, each token's logit within `tol` of the best at the
    position before it (a near-tie may go either way in bf16); otherwise what is wrong, for the message."""
    B, T = prompts.shape
    if not (isinstance(tokens, list) and len(tokens) == B and all(
            isinstance(row, list) and len(row) == n and all(type(t) is int for t in row) for row in tokens)):
        return f"generate must return {B} list(s) of {n} ints for a batch of {B}, got {str(tokens)[:120]}"
    device = next(model.parameters()).device
    ids = torch.cat([prompts, torch.tensor(tokens)[:, :-1]], dim=1).to(device)
    with torch.no_grad():
        logits = model(ids)[:, T - 1:].float()                           # (B, n, vocab)
    chosen = logits.gather(-1, torch.tensor(tokens, device=device)[..., None])[..., 0]
    short = logits.amax(-1) - chosen                                      # 0 where the greedy token was taken
    if bool((short <= tol).all()):
        return None
    b, i = (int(x) for x in (short > tol).nonzero()[0])
    best = int(logits[b, i].argmax())
    return (f"sequence {b} of the batch: new token {i} is {tokens[b][i]}, greedy gives {best} (its logit is "
            f"{short[b, i].item():.3g} below the best); tokens before it agree")


def weight_bytes(model) -> int:
    """Bytes of the distinct storages of a model's parameters and buffers (a tied head counted once): the
    tensors themselves, whatever device or dtype they are held in."""
    seen = {}
    for t in (*model.parameters(), *model.buffers()):
        storage = t.untyped_storage()
        seen[(storage.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def roofline(cfg: LlamaConfig, batch: int, context: int, dtype: torch.dtype, *, copy_gbps: float,
             tflops: float) -> dict:
    """Where one decode step sits on this device's roofline: its FLOPs and bytes (the formulas above), their
    ratio (arithmetic intensity, FLOPs per byte), the device's ridge point (peak FLOP/s over bandwidth), the
    floor each bound puts under the step's time, which of the two is larger ("memory" or "compute"), and the
    batch at which, by the formulas, decode at this context turns compute-bound."""
    flops, read = decode_flops(cfg, batch, context), decode_bytes(cfg, batch, context, dtype)
    ridge = tflops * 1e12 / (copy_gbps * 1e9)
    memory_s, compute_s = read / (copy_gbps * 1e9), flops / (tflops * 1e12)
    per_seq_flops = decode_flops(cfg, 1, context) - decode_flops(cfg, 0, context)   # what one more sequence adds
    weights = decode_bytes(cfg, 0, context, dtype)
    per_seq_bytes = decode_bytes(cfg, 1, context, dtype) - weights
    # flops(B) / bytes(B) = ridge  <=>  B (per_seq_flops - ridge per_seq_bytes) = ridge weights
    gain = per_seq_flops - ridge * per_seq_bytes
    crossover = math.ceil(ridge * weights / gain) if gain > 0 else None   # None: never, the KV reads grow as fast
    return {"flops": flops, "bytes": read, "intensity": flops / read, "ridge": ridge, "memory_floor_s": memory_s,
            "compute_floor_s": compute_s, "bound": "memory" if memory_s >= compute_s else "compute",
            "crossover_batch": crossover}
