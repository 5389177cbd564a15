"""Continuous batching: a scheduler that admits and retires sequences at every step under a token budget, over
a pool of KV blocks, preempting (and later recomputing) a sequence when the blocks run out.

    engine = Engine(ServeConfig.from_env())
    seq = engine.add(Sequence(prompt_ids, max_tokens))   # queued (FCFS)
    for seq, token, finished in engine.step():    # one forward pass over every running sequence
        ...
    engine.abort(seq)                             # a disconnect or a timeout: gone, its blocks free

The model and its paged KV pool are the course's (kit.batching.ModelRunner): you decide which sequences run in
a step, with which tokens, in which blocks. The handout (README.md) gives the rules; lab.yaml's hints the steps.
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from infracourse.kit.batching import ModelRunner, Piece, ServeConfig


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    max_tokens: int
    out: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    computed: int = 0           # tokens whose keys and values are in the blocks
    id: int = field(default_factory=itertools.count().__next__)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    @property
    def finished(self) -> bool:
        return len(self.out) >= self.max_tokens


class BlockManager:
    """Which KV blocks are free. A sequence of n tokens holds ceil(n / block_size) blocks."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free: deque[int] = deque(range(num_blocks))

    def grow(self, seq: Sequence, n_tokens: int) -> bool:
        """Give seq the blocks it still lacks to hold n_tokens; False (and nothing taken) when too few are free."""
        raise NotImplementedError("TODO: BlockManager.grow")

    def release(self, seq: Sequence) -> None:
        """Every block of seq back to the free list; seq holds none and has nothing computed."""
        raise NotImplementedError("TODO: BlockManager.release")


class Engine:
    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.runner = ModelRunner(cfg)
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> Sequence:
        self.waiting.append(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Forget seq wherever it is (a finished one is already gone) and free its blocks."""
        raise NotImplementedError("TODO: Engine.abort (a disconnect or a timeout)")

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Sequence]:
        """The sequences of this step: every running one decodes a token (preempting the sequence admitted last
        when a new block is needed and none is free), then waiting ones join in arrival order while
        max_num_seqs, the token budget (max_num_batched_tokens) and the free blocks allow."""
        raise NotImplementedError("TODO: Engine.schedule")

    def step(self) -> list[tuple[Sequence, int, bool]]:
        """One step: (sequence, its new token, finished) for every scheduled sequence; finished ones retire and
        free their blocks. The tokens: self.runner.step([Piece(...) per sequence]).argmax(-1)."""
        raise NotImplementedError("TODO: Engine.step")

    def state(self) -> dict:
        return {"num_blocks": self.cfg.num_blocks, "free_blocks": len(self.blocks.free),
                "running": len(self.running), "waiting": len(self.waiting), "preemptions": self.preemptions}
