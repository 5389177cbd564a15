"""Greedy generation with the kit GPT whose keys and values live in paged tensors placed by a learner's block
allocator and read by a learner's paged_attention (week 16): course code the grader and the learner's bench
both drive, so a figure in the report and the grader's measurement come from the same procedure.

    gen = PagedGeneration(paged, seed=7, blocks=64, block_size=16, prefix_caching=True)
    run = gen.generate("req0", prompt, new_tokens=8, clock=time.perf_counter)
    run.tokens, run.cached, run.record      # greedy ids, allocate's cached tokens, a kit.loadgen RequestRecord

`paged` is anything with `BlockAllocator(num_blocks, block_size, prefix_caching)` and
`paged_attention(q, k_cache, v_cache, block_tables, context_lens)`: the learner's module itself, or the grader's
proxy of it in the grading worker. paged_attention runs on `device`; the model and the paged K/V pool live on
`engine_device` (the host by default, as the CPU-timed serving figures were taken; "cuda" puts the whole engine on
the GPU, and `pool_device_bytes` is then what the device's allocator gave the pool). The model's other pieces
(embedding, projections, MLP, logits) are the course's; the prompt's cached tokens are NOT computed again: their keys and values are read from the blocks the
allocator shared, so a wrong share shows as a wrong token, and a hit shows as a shorter time to first token.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import torch

from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.loadgen import RequestRecord, compute_metrics

# Wide enough that a prefill's cost grows with the tokens computed (a narrower model is all per-op overhead on a
# CPU, and a prefix-cache hit would not show in the time to first token).
MODEL = GPTConfig(vocab_size=256, seq_len=160, d_model=256, n_head=4, n_kv_head=2, n_layer=4)


class InvalidAnswer(ValueError):
    """The allocator answered something generation cannot use (the message says what)."""


@dataclass
class Generation:
    tokens: list[int]
    cached: int
    record: RequestRecord


class PagedGeneration:
    def __init__(self, paged, *, seed: int, blocks: int, block_size: int, prefix_caching: bool,
                 cfg: GPTConfig = MODEL, device: str = "cpu", engine_device: str = "cpu"):
        self.paged, self.cfg, self.device, self.block = paged, cfg, device, block_size
        self.engine = engine_device
        self.model = GPT(cfg, seed=seed).eval().to(engine_device)
        shape = (blocks, block_size, cfg.kv_heads, cfg.head_dim)
        on_gpu = torch.device(engine_device).type == "cuda"
        before = torch.cuda.memory_allocated(engine_device) if on_gpu else 0
        self.k_caches = [torch.zeros(shape, device=engine_device) for _ in self.model.blocks]
        self.v_caches = [torch.zeros(shape, device=engine_device) for _ in self.model.blocks]
        # the pool as the device's allocator counts it (None off a GPU: host memory is no device figure)
        self.pool_device_bytes = torch.cuda.memory_allocated(engine_device) - before if on_gpu else None
        self.allocator = paged.BlockAllocator(blocks, block_size, prefix_caching)

    def kv_bytes(self, blocks: int) -> int:
        """Bytes of keys and values that `blocks` blocks hold: 2 x layers x KV heads x head_dim x tokens x 4."""
        return 2 * self.cfg.n_layer * self.cfg.kv_heads * self.cfg.head_dim * blocks * self.block * 4

    def _slots(self, table, start, stop):
        positions = torch.arange(start, stop, device=self.engine)
        return torch.tensor(table, device=self.engine)[positions // self.block], positions % self.block

    def _write(self, cache, table, start, kv):
        """kv (kv_heads, T, head_dim) into the slots of positions start .. start + T - 1."""
        cache[self._slots(table, start, start + kv.shape[1])] = kv.transpose(0, 1)

    def _gather(self, cache, table, n):
        """(1, kv_heads, n, head_dim): positions 0 .. n - 1 read through the table."""
        return cache[self._slots(table, 0, n)].transpose(0, 1)[None]

    @torch.no_grad()
    def generate(self, seq_id, prompt: list[int], new_tokens: int,
                 clock: Callable[[], float] = time.perf_counter) -> Generation:
        """Allocates the prompt, prefills its uncached tokens, decodes `new_tokens` greedily through
        paged_attention; the record's times (on `clock`) are the request's start and each token's arrival."""
        record = RequestRecord(prompt_tokens=len(prompt), send_time=clock())
        alloc, model = self.allocator, self.model
        cached = alloc.allocate(seq_id, list(prompt))
        if type(cached) is not int or not 0 <= cached <= len(prompt):
            raise InvalidAnswer(f"allocate returned {cached!r} cached tokens for a {len(prompt)}-token prompt "
                                f"(an int from 0 to {len(prompt)})")
        table = alloc.block_table(seq_id)
        # a prompt cached whole (every block full and matched) still runs its last token, for the logits the first
        # new token comes from; its keys and values are already in the shared block and are not written again
        start = min(cached, len(prompt) - 1)
        x = model.embed(torch.tensor([prompt[start:]], device=self.engine), start)
        for block, kc, vc in zip(model.blocks, self.k_caches, self.v_caches):
            q, k, v = block.attn.qkv_heads(block.norm1(x))
            if cached < len(prompt):
                self._write(kc, table, cached, k[0])
                self._write(vc, table, cached, v[0])
            x = x + block.attn.attend(q, self._gather(kc, table, len(prompt)), self._gather(vc, table, len(prompt)))
            x = x + block.mlp(block.norm2(x))
        token, n, tokens = int(model.logits(x)[0, -1].argmax()), len(prompt), []
        while True:
            tokens.append(token)
            record.chunk_times.append(clock())
            if len(tokens) == new_tokens:
                break
            alloc.append(seq_id, token)
            table = alloc.block_table(seq_id)
            x = model.embed(torch.tensor([[token]], device=self.engine), n)
            n += 1
            for block, kc, vc in zip(model.blocks, self.k_caches, self.v_caches):
                q, k, v = block.attn.qkv_heads(block.norm1(x))
                self._write(kc, table, n - 1, k[0])
                self._write(vc, table, n - 1, v[0])
                args = (q[:, :, 0], kc, vc, torch.tensor([table]), torch.tensor([n]))
                out = self.paged.paged_attention(*(t.to(self.device) for t in args))  # on the GPU if any
                x = x + block.attn.proj(out.to(x.device).reshape(1, 1, self.cfg.d_model).float())
                x = x + block.mlp(block.norm2(x))
            token = int(model.logits(x)[0, -1].argmax())
        record.output_tokens, record.success = len(tokens), True
        return Generation(tokens, cached, record)


# The shared-prefix workload of week 16: 8 requests, one 100-token system prompt + a 20-token question each, 8 new
# tokens, 16-token blocks, 64 blocks; served one request at a time (closed loop, concurrency 1: no queueing),
# every request kept live to the end, as a multi-turn session's cache would be.
BLOCKS, BLOCK, SYSTEM, QUESTION, REQUESTS, NEW = 64, 16, 100, 20, 8, 8
EXPECTED_CACHED = (SYSTEM // BLOCK) * BLOCK  # each request after the first finds the system prompt's full blocks


def shared_prefix_prompts(seed: int) -> list[list[int]]:
    r = random.Random(seed)
    system = [r.randrange(256) for _ in range(SYSTEM)]
    return [system + [r.randrange(256) for _ in range(QUESTION)] for _ in range(REQUESTS)]


def serve_shared_prefix(paged, seed: int, clock: Callable[[], float], device: str = "cpu",
                        on_request: Callable[[bool, int, Generation, PagedGeneration], None] | None = None) -> dict:
    """The workload with prefix caching on and off, the two runs alternating request by request so that load on
    the machine falls on both alike. `on_request(caching, i, run, generation)` sees each request as it ends.
    Returns {True: (records, generation), False: (...)} keyed by prefix caching."""
    prompts = shared_prefix_prompts(seed)
    runs = {caching: PagedGeneration(paged, seed=seed, blocks=BLOCKS, block_size=BLOCK, prefix_caching=caching,
                                     device=device) for caching in (True, False)}
    warm = PagedGeneration(paged, seed=seed, blocks=4, block_size=BLOCK, prefix_caching=False, device=device)
    warm.generate("warm-up", prompts[0][:BLOCK], 2, clock)  # first calls into torch (and a worker), untimed
    records = {True: [], False: []}
    for i, prompt in enumerate(prompts):
        for caching, gen in runs.items():
            run = gen.generate(f"req{i}", prompt, NEW, clock)
            if on_request:
                on_request(caching, i, run, gen)
            records[caching].append(run.record)
    return {caching: (records[caching], runs[caching]) for caching in runs}


def serving_figures(records: list[RequestRecord], gen: PagedGeneration) -> dict:
    """The acceptance's figures of one run: ms latencies (vLLM's definitions), output tokens/s over the run's
    busy time (closed loop: the sum of the requests' end-to-end latencies), blocks and KV bytes held at the end."""
    metrics = compute_metrics(records, sum(r.e2el for r in records))
    used = gen.allocator.state()["free"]
    blocks = BLOCKS - len(used)
    return {"ttft_p50_ms": metrics["ttft_ms"]["p50"], "ttft_p99_ms": metrics["ttft_ms"]["p99"],
            "tpot_p50_ms": metrics["tpot_ms"]["p50"], "e2el_p50_ms": metrics["e2el_ms"]["p50"],
            "e2el_p95_ms": metrics["e2el_ms"]["p95"], "e2el_p99_ms": metrics["e2el_ms"]["p99"],
            "output_tok_s": metrics["output_throughput"], "blocks": blocks, "kv_bytes": gen.kv_bytes(blocks)}
