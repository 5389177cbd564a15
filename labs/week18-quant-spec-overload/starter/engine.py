"""A sequential serving engine: one request runs at a time (one slot), the others wait in a FIFO queue.

    engine = Engine(model, pool, max_queue=8)
    rid = engine.submit(prompt, max_tokens, deadline_s=None)  # an int id, or None: rejected (HTTP 429)
    out = engine.step()           # [(rid, token)] emitted by this step (at most the running request's one)
    engine.cancel(rid)            # the client went away: its slot, queue place and blocks are freed now
    engine.status(rid)            # "queued" | "running" | "done" | "cancelled" | "expired"
    engine.queue_depth()          # requests admitted and waiting (the running one excluded)

`pool` is the course's BlockPool (infracourse.kit.block_pool): the running request holds the KV blocks of
prompt + max_tokens tokens from the step it starts until it ends, however it ends.

As given, the queue grows without bound, a deadline is ignored and cancel is missing: that is this week's work.
"""
import time
from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass
class Request:
    rid: int
    prompt: list
    max_tokens: int
    deadline: float | None  # time.monotonic() after which it may not start
    tokens: list = field(default_factory=list)
    blocks: list = field(default_factory=list)


class Engine:
    def __init__(self, model, pool, *, max_queue: int):
        self.model, self.pool, self.max_queue = model, pool, max_queue
        self.queue: deque[Request] = deque()
        self.running: Request | None = None
        self.states: dict[int, str] = {}
        self.next_id = 0

    def submit(self, prompt, max_tokens: int, deadline_s: float | None = None):
        # TODO: admission control: when max_queue requests already wait, return None at once (a 429)
        rid, self.next_id = self.next_id, self.next_id + 1
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.queue.append(Request(rid, list(prompt), max_tokens, deadline))
        self.states[rid] = "queued"
        return rid

    def cancel(self, rid: int) -> None:
        # TODO: a running request: free its blocks and its slot now; a queued one: take it out of the queue.
        raise NotImplementedError("cancel: free the slot and the blocks, mark the request 'cancelled'")

    def status(self, rid: int) -> str:
        return self.states[rid]

    def queue_depth(self) -> int:
        return len(self.queue)

    @torch.no_grad()
    def step(self) -> list:
        if self.running is None and not self._start_next():
            return []
        req = self.running
        ids = torch.tensor([req.prompt + req.tokens])
        token = int(self.model(ids)[0, -1].argmax())
        req.tokens.append(token)
        if len(req.tokens) == req.max_tokens:
            self._finish(req, "done")
        return [(req.rid, token)]

    def _start_next(self) -> bool:
        # TODO: a request that waited past its deadline is marked 'expired' and never starts
        if not self.queue:
            return False
        req = self.queue.popleft()
        req.blocks = self.pool.allocate(self.pool.blocks_for(len(req.prompt) + req.max_tokens))
        self.running = req
        self.states[req.rid] = "running"
        return True

    def _finish(self, req: Request, state: str) -> None:
        self.pool.free(req.blocks)
        req.blocks = []
        self.states[req.rid] = state
        self.running = None
