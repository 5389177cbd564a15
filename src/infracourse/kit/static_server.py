"""The course's static-batching server: the baseline week 17's continuous batching is timed against.

Static (request-level) batching, as servers did before Orca: take up to max_num_seqs waiting requests (first come,
first served) whose whole KV (prompt + max_tokens) fits the pool, prefill them together, decode the batch until
its LAST member is done, free everything, then take the next batch. A request that arrives meanwhile waits for
the whole batch, and a short request's slot idles while a long one finishes. Same model, same model runner
(kit.batching.ModelRunner), same limits and same HTTP API as the lab's server, so the judge's throughput
ratio measures the scheduling only. Served by uvicorn exactly like the learner's app:

    python -m uvicorn infracourse.kit.static_server:app --uds SOCK        (limits from INFRACOURSE_SERVE)
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import queue
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from infracourse.kit.batching import SERVE_GPT, ModelRunner, Piece, ServeConfig

_ids = itertools.count()


@dataclass
class _Request:
    prompt: list[int]
    max_tokens: int
    out: list[int] = field(default_factory=list)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    blocks: list[int] = field(default_factory=list)
    cancelled: bool = False


class StaticBatcher:
    """The engine, in its own thread: requests come in through `inbox`, tokens go out through each request's
    asyncio queue (call_soon_threadsafe), so the event loop keeps serving HTTP while a step runs."""

    def __init__(self, cfg: ServeConfig, loop: asyncio.AbstractEventLoop):
        self.cfg, self.loop = cfg, loop
        self.runner = ModelRunner(cfg)
        self.free = list(range(cfg.num_blocks))
        self.inbox: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self.waiting: deque[_Request] = deque()
        self.batch: list[_Request] = []

    def _blocks(self, r: _Request) -> int:
        return math.ceil((len(r.prompt) + r.max_tokens) / self.cfg.block_size)

    def _emit(self, r: _Request, token: int) -> None:
        r.out.append(token)
        self.loop.call_soon_threadsafe(r.queue.put_nowait, token)

    def step(self) -> None:
        if not self.batch:  # a new batch only when the previous one has finished entirely
            while self.waiting and len(self.batch) < self.cfg.max_num_seqs:
                r = self.waiting[0]
                if r.cancelled:
                    self.waiting.popleft()
                    continue
                if self._blocks(r) > len(self.free):
                    break
                r.blocks = [self.free.pop() for _ in range(self._blocks(r))]
                self.batch.append(self.waiting.popleft())
            if not self.batch:
                return
            live = self.batch
            pieces = [Piece(r.prompt, 0, r.blocks) for r in live]
        else:
            live = [r for r in self.batch if len(r.out) < r.max_tokens and not r.cancelled]
            pieces = [Piece([r.out[-1]], len(r.prompt) + len(r.out) - 1, r.blocks) for r in live]
        if pieces:
            for r, token in zip(live, self.runner.step(pieces).argmax(-1).tolist()):
                self._emit(r, token)
        if all(len(r.out) >= r.max_tokens or r.cancelled for r in self.batch):
            for r in self.batch:
                self.free.extend(r.blocks)
                r.blocks = []
            self.batch = []

    def run(self) -> None:
        while True:
            idle = not self.waiting and not self.batch
            try:  # wait for work when idle; otherwise take what arrived and step
                while True:
                    self.waiting.append(self.inbox.get(block=idle))
                    idle = False
            except queue.Empty:
                pass
            self.step()


@asynccontextmanager
async def _lifespan(app: FastAPI):
    import torch

    torch.set_num_threads(1)
    app.state.engine = StaticBatcher(ServeConfig.from_env(), asyncio.get_running_loop())
    threading.Thread(target=app.state.engine.run, daemon=True).start()
    yield


app = FastAPI(lifespan=_lifespan)


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.get("/debug/state")
async def state(request: Request):
    e: StaticBatcher = request.app.state.engine
    return {"num_blocks": e.cfg.num_blocks, "free_blocks": len(e.free), "running": len(e.batch),
            "waiting": len(e.waiting) + e.inbox.qsize()}


def completion_chunk(rid: str, text: str, finish: str | None = None, usage: dict | None = None,
                     fingerprint: str | None = None) -> str:
    """One server-sent event of an OpenAI-style streamed completion (the course's servers all speak it)."""
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": "kit-gpt",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if fingerprint is not None:
        body["system_fingerprint"] = fingerprint
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


@app.post("/v1/completions")
async def completions(request: Request):
    e: StaticBatcher = request.app.state.engine
    body = await request.json()
    prompt, max_tokens = body.get("prompt"), body.get("max_tokens", 16)
    if isinstance(prompt, str):
        prompt = list(prompt.encode())
    if (not isinstance(prompt, list) or not prompt or not all(type(t) is int and 0 <= t < SERVE_GPT.vocab_size
                                                                for t in prompt)
            or type(max_tokens) is not int or max_tokens < 1 or len(prompt) + max_tokens > SERVE_GPT.seq_len):
        return JSONResponse({"error": {"message": "bad prompt or max_tokens"}}, status_code=400)
    if len(e.waiting) + e.inbox.qsize() >= e.cfg.max_waiting:
        return JSONResponse({"error": {"message": "queue full"}}, status_code=429)
    r = _Request(prompt, max_tokens)
    e.inbox.put(r)
    rid = f"cmpl-{next(_ids)}"

    async def stream():
        try:
            for _ in range(max_tokens):
                yield completion_chunk(rid, chr(await r.queue.get()))
            usage = {"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                     "total_tokens": len(prompt) + max_tokens}
            yield completion_chunk(rid, "", "length", usage)
            yield "data: [DONE]\n\n"
        finally:
            r.cancelled = True  # a disconnect: its slot idles until the batch ends, as static batching does

    return StreamingResponse(stream(), media_type="text/event-stream")
