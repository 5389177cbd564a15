"""Continuous batching: a scheduler that admits and retires sequences at every step under a token budget, over
a pool of KV blocks, preempting (and later recomputing) a sequence when the blocks run out.

    engine = Engine(ServeConfig.from_env())
    seq = engine.add(Sequence(prompt_ids, max_tokens))   # queued (FCFS)
    for seq, token, finished in engine.step():    # one forward pass over every running sequence
        ...
    engine.abort(seq)                             # a disconnect or a timeout: gone, its blocks free
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
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free: deque[int] = deque(range(num_blocks))

    def needed(self, seq: Sequence, n_tokens: int) -> int:
        """Blocks seq must still get to hold n_tokens."""
        return max(0, math.ceil(n_tokens / self.block_size) - len(seq.block_table))

    def grow(self, seq: Sequence, n_tokens: int) -> bool:
        """Give seq the blocks to hold n_tokens; False (and nothing taken) when too few are free."""
        n = self.needed(seq, n_tokens)
        if n > len(self.free):
            return False
        seq.block_table += [self.free.popleft() for _ in range(n)]
        return True

    def release(self, seq: Sequence) -> None:
        self.free.extend(reversed(seq.block_table))
        seq.block_table = []
        seq.computed = 0


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
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self) -> Sequence:
        """Take back the blocks of the sequence admitted last; it waits at the front and is recomputed later."""
        victim = self.running.pop()
        self.blocks.release(victim)
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    def schedule(self) -> list[Sequence]:
        """The sequences of this step: every running one decodes a token (preempting when a new block is
        needed and none is free), then waiting ones join in arrival order while the token budget, the batch
        size and the blocks allow. The head of the queue is never skipped: a long prompt is not starved."""
        scheduled = []
        for seq in list(self.running):
            if seq not in self.running:
                continue  # preempted below to make room for an earlier one
            while not self.blocks.grow(seq, len(seq.tokens)):
                if self._preempt() is seq:
                    break
            else:
                scheduled.append(seq)
        budget = self.cfg.max_num_batched_tokens - len(scheduled)
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if len(seq.tokens) > budget or not self.blocks.grow(seq, len(seq.tokens)):
                break
            budget -= len(seq.tokens)
            self.running.append(self.waiting.popleft())
            scheduled.append(seq)
        return scheduled

    def step(self) -> list[tuple[Sequence, int, bool]]:
        """One step: (sequence, its new token, finished) for every scheduled sequence; finished ones retire."""
        batch = self.schedule()
        if not batch:
            return []
        pieces = [Piece(s.tokens[s.computed:], s.computed, s.block_table) for s in batch]
        tokens = self.runner.step(pieces).argmax(-1).tolist()
        outputs = []
        for seq, token in zip(batch, tokens):
            seq.computed = len(seq.tokens)
            seq.out.append(token)
            if seq.finished:
                self.running.remove(seq)
                self.blocks.release(seq)
            outputs.append((seq, token, seq.finished))
        return outputs

    def state(self) -> dict:
        return {"num_blocks": self.cfg.num_blocks, "free_blocks": len(self.blocks.free),
                "running": len(self.running), "waiting": len(self.waiting), "preemptions": self.preemptions}
