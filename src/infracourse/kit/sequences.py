"""Week 3's fixed pieces: variable-length token sequences and a position-wise model to run them through.

Real requests differ in length: most are short, a few are long. `sample_lengths` draws lengths from a
seeded long-tailed (lognormal) distribution, and `random_batches` turns them into batches of token
sequences. `TokenModel` is the tiny GPT without attention: embedding, residual MLP blocks, output head.
Every position is computed on its own, so a sequence's outputs do not depend on what it is batched with,
padded to, or packed beside: padding is pure waste, and the share of waste is exactly the share of padding
tokens. (In a Transformer the linear layers, most of the FLOPs, are position-wise too; variable-length
attention kernels give attention the same property.)
"""
from __future__ import annotations

import math
import random

import torch
import torch.nn as nn

from infracourse.kit.gpt import MLP, GPTConfig, RMSNorm


def sample_lengths(count: int, *, seed: int, median: int = 24, max_len: int = 256, sigma: float = 1.0) -> list[int]:
    """`count` lengths from a lognormal with this median, clipped to 1..max_len."""
    rng = random.Random(seed)  # private: never disturbs, or depends on, the global RNGs
    return [min(max(round(median * math.exp(rng.gauss(0.0, sigma))), 1), max_len) for _ in range(count)]


def random_batches(batches: int, batch_size: int, *, vocab: int, seed: int, device: str = "cpu",
                   **length_args) -> list[list[torch.Tensor]]:
    """`batches` lists of `batch_size` 1-D int64 token tensors of lengths from `sample_lengths`."""
    lengths = sample_lengths(batches * batch_size, seed=seed, **length_args)
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(vocab, (n,), generator=gen).to(device) for n in lengths]
    return [seqs[i:i + batch_size] for i in range(0, len(seqs), batch_size)]


class TokenModel(nn.Module):
    """tokens (...,) int64 -> logits (..., vocab). Any leading shape: (N,) packed or (B, L) padded."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), *, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's RNG
            torch.manual_seed(seed)
            self.emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.norms = nn.ModuleList(RMSNorm(cfg.d_model) for _ in range(cfg.n_layer))
            self.mlps = nn.ModuleList(MLP(cfg) for _ in range(cfg.n_layer))
            self.norm = RMSNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)  # (..., C)
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.head(self.norm(x))  # (..., vocab)


def token_model(*, vocab_size: int, d_model: int, n_layer: int, seed: int, device: str = "cpu") -> TokenModel:
    """TokenModel(GPTConfig(...), seed=seed) on `device`: plain arguments, so a grader can build the same model
    inside the grading worker (BuildInWorker) as the one it keeps for its references."""
    cfg = GPTConfig(vocab_size=vocab_size, d_model=d_model, n_layer=n_layer)
    return TokenModel(cfg, seed=seed).to(device)


class SchemeLoop:
    """Every batch through `scheme` and `model` once per call, the device drained at the end: built in the
    grading worker beside the learner's scheme, so a grader can clock a whole pass over the batches from its
    own process, with no round trip per batch and no tensors crossing during the clocked calls."""

    def __init__(self, scheme, model: nn.Module, batches: list[list[torch.Tensor]]):
        self.scheme, self.model, self.batches = scheme, model, batches
        self.outputs: list = []  # what the last pass's unpack returned, per batch: the timed outputs

    def __call__(self) -> None:
        # Keeping a reference costs nothing inside the clock; the outputs are digested only when asked. The
        # previous pass's are dropped first, so at most one pass's outputs are held.
        self.outputs = []
        for seqs in self.batches:
            tokens, unpack = self.scheme(seqs)
            self.outputs.append(unpack(self.model(tokens)))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def digest(self) -> list[list[tuple]]:
        """The last pass's outputs, per batch and sequence: (shape, float64 sum), for a grader to compare with
        its own model's outputs on the same sequences (the timed outputs, not a separate correctness run)."""
        return [[(tuple(out.shape), float(out.double().sum())) if isinstance(out, torch.Tensor) else (None, None)
                 for out in batch] if isinstance(batch, (list, tuple)) else [] for batch in self.outputs]


class StampedModel(nn.Module):
    """A model that keeps a record of every forward call: when it started and ended on the worker's clock and
    how many positions it computed. Built in the grading worker around the course's model and handed to the
    learner's code, so a grader can compare the figures the learner reports with what the model really did
    (`take()` returns the records since the last take and clears them).

    On a GPU the end of a call is stamped by CUDA events, read in `take()`: the wrapper adds no synchronise
    of its own, so code that forgets to wait for the device still measures the launch, not the work."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self._calls: list[tuple] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        import time

        if tokens.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            host = time.perf_counter()
            start.record()
            out = self.model(tokens)
            end.record()
            self._calls.append((host, (start, end), tokens.numel()))
            return out
        host = time.perf_counter()
        out = self.model(tokens)
        self._calls.append((host, time.perf_counter(), tokens.numel()))
        return out

    def take(self) -> list[tuple[float, float, int]]:
        """(start_s, end_s, positions) of each forward call since the last take, on the worker's clock."""
        calls, self._calls = self._calls, []
        out = []
        for host, end, positions in calls:
            if isinstance(end, tuple):  # GPU: the host stamp plus the kernels' own length
                end[1].synchronize()
                end = host + end[0].elapsed_time(end[1]) / 1e3
            out.append((host, end, positions))
        return out


def warm_up(model: nn.Module, batches: list[list[torch.Tensor]]) -> None:
    """Each batch through `model` once, packed (the first calls pay for the allocator and caches), the device
    drained: built in the grading worker, so a grader warms the model the learner's code is about to time."""
    for seqs in batches:
        model(torch.cat(seqs))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
