"""The serving model of week 17, its paged KV storage and its model runner: frozen course code that the
learner's scheduler (continuous batching) and the course's static-batching baseline both call, so that a
throughput comparison between them measures scheduling only.

    cfg = ServeConfig.from_env()                  # the judge's settings (INFRACOURSE_SERVE, JSON), defaults below
    runner = ModelRunner(cfg)                     # the model (kit GPT, SERVE_GPT's shape, seeded) and its KV pool
    logits = runner.step([                        # one engine step over a ragged batch (vLLM's flattened batch):
        Piece(tokens=[5, 9, 2], start=0, block_table=[3]),      #   a prefill of 3 tokens at positions 0..2
        Piece(tokens=[17], start=40, block_table=[0, 7, 1, ...]),  #   a decode step: 1 token at position 40
    ])                                            # -> (2, vocab) logits of each piece's LAST token
    next_ids = logits.argmax(-1).tolist()         # greedy

A piece's tokens are written into the slots its block table names (token p of the sequence lives in slot
p % block_size of block block_table[p // block_size]), then attend to every key of positions 0 .. start + T - 1
read back from those blocks. The blocks must hold the sequence's earlier keys and values already: a piece that
starts at `start` has had positions 0 .. start - 1 computed in earlier steps (a prefill split in chunks works the
same way). Which blocks a sequence owns, when it gets them and when they are freed is the scheduler's business:
this module never allocates. Ties in argmax go to the lowest id (torch.argmax), as in kit.generate.

Why a step floor: on a GPU a decode step reads every weight once, so it costs about the same for 1 sequence or
16; that is what makes batching pay. A tiny model on a CPU is the opposite (Python overhead per sequence). The
runner therefore stands in for a device: a step lasts at least `step_floor_ms` (it sleeps the rest, leaving the
CPU to the HTTP side), whatever the batch. `forward_batch(model, pool, pieces)` is the same step without it.

The model on a device: `ServeConfig.model` names a folder holding a Llama-layout checkpoint (kit.hf_checkpoint,
vocabulary 128), served in its own dtype (bf16 on a GPU) with a pool of that dtype, and no floor (step_floor_ms 0):
the step then costs what the device takes to read the weights. ModelRunner's `memory` says where its figures
come from: "device" (the CUDA allocator: the pool's bytes around its allocation, max_memory_allocated) or
"cpu-stand-in" (host tensors' sizes), and `memory_report` names a file it writes them to.
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from infracourse.kit.env_config import EnvConfig
from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.hf_checkpoint import LlamaConfig
from infracourse.kit.llama import Llama
from infracourse.kit.loadgen import request_matrix

ENV = "INFRACOURSE_SERVE"
# vocabulary 128: every token id is one ASCII character, so a streamed text maps back to its ids one to one
SERVE_GPT = GPTConfig(vocab_size=128, seq_len=128, d_model=64, n_head=4, n_kv_head=2, n_layer=2)


@dataclass(frozen=True)
class ServeConfig(EnvConfig):
    """The engine's limits, set by whoever starts the server (the judge, or your bench script) through the
    INFRACOURSE_SERVE environment variable, a JSON object of these fields; absent fields keep these defaults."""
    env_var: ClassVar[str] = ENV
    seed: int = 0                       # the model's weights
    max_num_seqs: int = 16              # sequences running at once (the batch's rows)
    max_num_batched_tokens: int = 64    # tokens computed in one step, prefill and decode together
    block_size: int = 8                 # tokens per KV block
    num_blocks: int = 96                # KV blocks in the pool
    max_waiting: int = 32               # requests queued beyond the running ones; more are refused (429)
    request_timeout_s: float = 30.0     # a request not finished this long after it arrived is aborted
    step_floor_ms: float = 0.0          # the least time a step takes (ModelRunner): a device's weight-bound step
    device: str = "cpu"
    step_journal: str = ""              # a file ModelRunner appends each step's pieces to (the judge reads it)
    model: str = ""                     # "": the tiny GPT (SERVE_GPT, from seed); else a Llama checkpoint's folder
    memory_report: str = ""             # a file ModelRunner writes its memory figures to (JSON), as its peak grows


def serve_model(cfg: ServeConfig | None = None) -> GPT | Llama:
    """The served model: the course's tiny GPT, or the checkpoint `cfg.model` names (in its stored dtype)."""
    cfg = cfg or ServeConfig()
    if not cfg.model:
        return GPT(SERVE_GPT, seed=cfg.seed).to(cfg.device).eval()
    model = Llama.from_checkpoint(cfg.model, device=cfg.device)
    if model.cfg.vocab != SERVE_GPT.vocab_size or model.cfg.max_positions < SERVE_GPT.seq_len:
        raise ValueError(f"{cfg.model}: vocabulary {model.cfg.vocab} and {model.cfg.max_positions} positions; the "
                         f"server's text is one character per token: vocabulary {SERVE_GPT.vocab_size} and at least "
                         f"{SERVE_GPT.seq_len} positions")
    return model


def kv_pool_bytes(model_cfg: GPTConfig | LlamaConfig, num_blocks: int, block_size: int,
                  dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the pool's K and V tensors: 2 x layers x KV heads x head_dim x slots x element size."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * model_cfg.n_layer * model_cfg.kv_heads * model_cfg.head_dim * num_blocks * block_size * elem


class KVPool:
    """K and V of every block: (n_layer, kv_heads, num_blocks * block_size, head_dim) each; a block is a run of
    block_size consecutive slots."""

    def __init__(self, model_cfg: GPTConfig | LlamaConfig, num_blocks: int, block_size: int, *, dtype=torch.float32,
                 device: str = "cpu"):
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (model_cfg.n_layer, model_cfg.kv_heads, num_blocks * block_size, model_cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def slots(self, block_table: list[int], positions: range) -> list[int]:
        """The slot of each position: block_table[p // block_size] * block_size + p % block_size."""
        bs = self.block_size
        if positions and positions[-1] // bs >= len(block_table):
            raise ValueError(f"position {positions[-1]} needs block {positions[-1] // bs} but the block table holds "
                             f"{len(block_table)} block(s) of {bs} tokens")
        for b in block_table:
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"block id {b} outside the pool's 0..{self.num_blocks - 1}")
        return [block_table[p // bs] * bs + p % bs for p in positions]


class ModelRunner:
    """The model, its KV pool (in the model's dtype, on its device) and the step floor: what an engine calls
    once per step."""

    def __init__(self, cfg: ServeConfig):
        self.model = serve_model(cfg)
        dtype = next(self.model.parameters()).dtype
        weights = _allocated(cfg.device)
        self.pool = KVPool(self.model.cfg, cfg.num_blocks, cfg.block_size, dtype=dtype, device=cfg.device)
        self.memory = pool_memory(self.pool, self.model.cfg, dtype, cfg.device, weights)
        self.floor_s = cfg.step_floor_ms / 1000.0
        self.steps = 0
        # one JSON line per step, [[start, tokens, block_table], ...] of its pieces: what the judge holds against
        # the scheduler's rules (the token budget, preemption, first come first served)
        self.journal = open(cfg.step_journal, "a", buffering=1) if cfg.step_journal else None
        self.report = cfg.memory_report
        self._write_memory()

    def step(self, pieces: list["Piece"]) -> torch.Tensor:
        """forward_batch over `pieces`, lasting at least the floor: (len(pieces), vocab) logits."""
        started = time.perf_counter()
        logits = forward_batch(self.model, self.pool, pieces)
        self.steps += 1
        if self.journal is not None:
            rows = [[int(p.start), [int(t) for t in p.tokens], [int(b) for b in p.block_table]] for p in pieces]
            self.journal.write(json.dumps(rows) + "\n")
        if self.memory["source"] == "device" and torch.cuda.max_memory_allocated() > self.memory["max_allocated"]:
            self.memory["max_allocated"] = torch.cuda.max_memory_allocated()  # the allocator's count: no sync
            self._write_memory()
        rest = self.floor_s - (time.perf_counter() - started)
        if rest > 0:
            time.sleep(rest)
        return logits

    def _write_memory(self) -> None:
        if self.report:
            with open(self.report, "w") as f:
                json.dump(self.memory, f)


def _allocated(device: str) -> int:
    """Bytes the CUDA allocator holds for tensors now (0 on a CPU)."""
    if torch.device(device).type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def pool_memory(pool: KVPool, model_cfg, dtype: torch.dtype, device: str, weights: int) -> dict:
    """The pool's memory figures and where they come from. On CUDA the allocator's ("device"): the bytes it
    gave the pool (memory_allocated after the pool less `weights`, what it held before), the model's bytes
    and max_memory_allocated, which ModelRunner.step keeps up to date. On a CPU the pool's host tensors' sizes
    stand in for device memory and say so ("cpu-stand-in")."""
    formula = kv_pool_bytes(model_cfg, pool.num_blocks, pool.block_size, dtype)
    figures = {"dtype": str(dtype).removeprefix("torch."), "kv_pool_formula": formula,
               "num_blocks": pool.num_blocks, "block_size": pool.block_size}
    if torch.device(device).type == "cuda":
        held = _allocated(device)
        return {"source": "device", "measure": "torch.cuda.memory_allocated around the pool's allocation",
                "device": torch.cuda.get_device_name(device), "weights_bytes": weights,
                "kv_pool_bytes": held - weights, "max_allocated": torch.cuda.max_memory_allocated(device), **figures}
    return {"source": "cpu-stand-in", "measure": "sizes of the pool's tensors in host memory, standing in for "
            "device memory", "device": "cpu", "kv_pool_bytes": pool.nbytes, **figures}


@dataclass
class Piece:
    """What one sequence contributes to a step: new tokens at positions start .. start + len(tokens) - 1."""
    tokens: list[int]
    start: int
    block_table: list[int] = field(default_factory=list)


@torch.no_grad()
def forward_batch(model: GPT | Llama, pool: KVPool, pieces: list[Piece]) -> torch.Tensor:
    """One engine step over a ragged batch; returns (len(pieces), vocab) fp32 logits of each piece's last token.

    Every piece attends in one call per layer: its queries and keys padded on the LEFT to the batch's longest
    (B pieces, T = most new tokens, S = most keys), so that each piece's queries are the last of its keys, as
    `attend` expects, and a RoPE model sees each query and key at its own distance (padding keys masked; the
    rows of padding queries are dropped)."""
    if not pieces or any(not p.tokens for p in pieces):
        raise ValueError("forward_batch needs at least one piece, each with at least one token")
    device = pool.k.device
    lengths = [len(p.tokens) for p in pieces]
    ends = [p.start + n for p, n in zip(pieces, lengths)]                # piece i attends to positions < ends[i]
    if max(ends) > model.cfg.seq_len:
        raise ValueError(f"a position reaches {max(ends) - 1}, the model holds {model.cfg.seq_len}")
    reads = [pool.slots(p.block_table, range(end)) for p, end in zip(pieces, ends)]
    B, T, S = len(pieces), max(lengths), max(ends)
    first = list(itertools.accumulate(lengths, initial=0))               # each piece's first row of the N tokens
    ids = torch.tensor([t for p in pieces for t in p.tokens], device=device)
    pos = torch.tensor([i for p, end in zip(pieces, ends) for i in range(p.start, end)], device=device)
    write = torch.tensor([s for r, n in zip(reads, lengths) for s in r[-n:]], device=device)
    keys = torch.tensor([[0] * (S - end) + r for r, end in zip(reads, ends)], device=device)           # (B, S)
    key_mask = torch.arange(S, device=device)[None] >= S - torch.tensor(ends, device=device)[:, None]
    queries = torch.tensor([[0] * (T - n) + list(range(f, f + n)) for f, n in zip(first, lengths)],
                           device=device)                                                               # (B, T)
    real = torch.tensor([b * T + t for b, n in enumerate(lengths) for t in range(T - n, T)], device=device)
    x = _embed(model, ids, pos)                                           # (1, N, C), N tokens of all pieces
    for layer, block in enumerate(model.blocks):
        q, k, v = block.attn.qkv_heads(block.norm1(x))                   # q (1, H, N, hd), k v (1, KV, N, hd)
        kc, vc = pool.k[layer], pool.v[layer]                            # (KV, slots, hd)
        kc[:, write] = k[0].to(kc.dtype)
        vc[:, write] = v[0].to(vc.dtype)
        K = kc[:, keys].transpose(0, 1).to(q.dtype)                      # (B, KV, S, hd)
        V = vc[:, keys].transpose(0, 1).to(q.dtype)
        Q = q[0][:, queries].transpose(0, 1)                             # (B, H, T, hd)
        y = block.attn.attend(Q, K, V, key_mask=key_mask)                # (B, T, C)
        x = x + y.reshape(B * T, -1)[real][None]                         # the real rows, in the pieces' order
        x = x + block.mlp(block.norm2(x))
    last = torch.tensor(first[1:], device=device) - 1
    return model.logits(x[:, last])[0].float()


def _embed(model: GPT | Llama, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """(N,) token ids at positions `pos` -> (1, N, C): the GPT adds its learned position embeddings; a Llama's
    positions act in attention (RoPE)."""
    if isinstance(model, Llama):
        return model.model.embed_tokens(ids)[None]
    return model.tok_emb(ids)[None] + model.pos_emb(pos)[None]


# The week 17 load point, shared by the judge and the learner's bench script ----------------------------------
# A closed loop of BENCH_CONCURRENCY requests in flight, all sent at once (rate inf): most requests want 2 new
# tokens, one in 12 wants 48, so a static batch waits for its longest member while continuous batching refills.
# 384 requests: the run must be long against its drain (the last 48-token requests finish alone, ~0.6 s); with
# 192, that drain held continuous batching to half the floor's 1333 tok/s and the ratio to static near 4x.
BENCH_INPUT_LENS, BENCH_OUTPUT_LENS, BENCH_PER_CELL = (8, 24), (2,) * 11 + (48,), 16   # 384 requests
BENCH_CONCURRENCY = 32
BENCH_SLO_MS = {"ttft": 300.0, "tpot": 30.0}    # goodput: a request meeting both
DEVICE_PRICE_PER_HOUR = 2.0                     # dollars per device hour, for the cost figures


def bench_config(device: str = "cpu") -> ServeConfig:
    """The engine limits of the load point. The runner's 12 ms step floor holds on every device: the served GPT
    is tiny, so without it a GPU step is host-bound and the HTTP side, not the schedule, sets the throughput
    (on an H200: continuous 2.6x static with no floor). 12 ms is the decode step of a model whose weights fill
    ~50 GB at the H200's 4.2 TB/s, the regime batching is for. 96 blocks: in the steady state about 11 of the
    16 rows hold 48-token requests (they take 69 % of the slot time), ~100 blocks at their longest, so the pool
    still runs out now and then (preemption happens) without capping the batch; 48 blocks capped it at ~8 rows."""
    return ServeConfig(max_num_seqs=16, max_num_batched_tokens=128, block_size=8, num_blocks=96, max_waiting=32,
                       request_timeout_s=30.0, step_floor_ms=12.0, device=device)


def bench_specs(seed: int = 0):
    """The load point's 192 requests (kit.loadgen.request_matrix over SERVE_GPT's vocabulary), shuffled."""
    return request_matrix(BENCH_INPUT_LENS, BENCH_OUTPUT_LENS, BENCH_PER_CELL, vocab_size=SERVE_GPT.vocab_size,
                          seed=seed)
