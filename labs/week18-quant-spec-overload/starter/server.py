"""Your engine served over HTTP (FastAPI + uvicorn, as vLLM serves): nothing to write here, the work is in
engine.py. The judge starts it as

    INFRACOURSE_SERVE='{"max_queue": 4, "step_s": 0.01}' python -m uvicorn server:app --uds /tmp/s.sock

POST /v1/completions  {"prompt": [ids], "max_tokens": n, "timeout_s": s (optional)} streams one SSE event per
                      token (its text is chr(token)). engine.submit's None is answered 429 at once; a client
                      that goes away cancels its request (engine.cancel); timeout_s is the request's deadline.
GET /stats            queue depth, free and total blocks, the deepest queue seen, requests per status.

One thread steps the engine; each step lasts at least step_s (a floor that stands for a bigger model's
decode step), so the service time of a request is max_tokens x step_s and the capacity 1 / that.
"""
import asyncio
import json
import os
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine import Engine
from infracourse.kit.block_pool import BlockPool
from infracourse.kit.gpt import GPT, GPTConfig

SERVE_CFG = GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_head=2, n_layer=2)
ENDED = ("done", "cancelled", "expired")


class Served:
    """The engine behind a lock (the stepping thread and the event loop both call it) and one asyncio queue
    of tokens per live stream; None in a queue means the request ended without its tokens (expired)."""

    def __init__(self, cfg: dict, loop: asyncio.AbstractEventLoop):
        self.pool = BlockPool(cfg.get("num_blocks", 48), cfg.get("block_size", 4))
        model = GPT(SERVE_CFG, seed=cfg.get("seed", 0)).eval()
        self.engine = Engine(model, self.pool, max_queue=cfg.get("max_queue", 4))
        self.step_s, self.loop, self.lock = cfg.get("step_s", 0.01), loop, threading.Lock()
        self.streams: dict[int, asyncio.Queue] = {}
        self.rids: list[int] = []  # every admitted request, for /stats
        self.deepest = 0

    def run(self) -> None:
        while True:
            t0 = time.perf_counter()
            with self.lock:
                out = self.engine.step()
                ended = [rid for rid in self.streams if self.engine.status(rid) in ("expired", "cancelled")]
            for rid, token in out:
                self._send(rid, token)
            for rid in ended:
                self._send(rid, None)
            time.sleep(max(self.step_s - (time.perf_counter() - t0), 0.001 if not out else 0.0))

    def _send(self, rid, item) -> None:
        stream = self.streams.get(rid)
        if stream is not None:
            self.loop.call_soon_threadsafe(stream.put_nowait, item)


@asynccontextmanager
async def lifespan(app: FastAPI):
    torch.set_num_threads(1)
    app.state.served = Served(json.loads(os.environ.get("INFRACOURSE_SERVE", "{}")), asyncio.get_running_loop())
    threading.Thread(target=app.state.served.run, daemon=True).start()
    yield


app = FastAPI(lifespan=lifespan)


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.get("/stats")
async def stats(request: Request):
    served: Served = request.app.state.served
    with served.lock:
        states = Counter(served.engine.status(rid) for rid in served.rids)
        return {"queue_depth": served.engine.queue_depth(), "deepest_queue": served.deepest,
                "free_blocks": served.pool.num_free, "num_blocks": served.pool.num_blocks, "statuses": dict(states)}


@app.post("/v1/completions")
async def completions(request: Request):
    served: Served = request.app.state.served
    body = await request.json()
    prompt, max_tokens, timeout = body.get("prompt"), body.get("max_tokens", 16), body.get("timeout_s")
    if not (isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < 256 for t in prompt)):
        return error(400, "prompt must be a non-empty list of token ids below 256")
    if type(max_tokens) is not int or max_tokens < 1 or len(prompt) + max_tokens > SERVE_CFG.seq_len:
        return error(400, f"max_tokens must be >= 1 and prompt + max_tokens <= {SERVE_CFG.seq_len}")
    tokens: asyncio.Queue = asyncio.Queue()
    with served.lock:
        rid = served.engine.submit(prompt, max_tokens, deadline_s=timeout)
        if rid is not None:
            served.streams[rid] = tokens
            served.rids.append(rid)
            served.deepest = max(served.deepest, served.engine.queue_depth())
    if rid is None:  # the queue is full: refuse now rather than let every wait grow
        return error(429, "the queue is full; try again later")

    def chunk(text: str, finish=None, **extra) -> str:
        return sse({"id": f"cmpl-{rid}", "object": "text_completion", "model": "kit-gpt",
                    "choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra})

    async def stream():
        n = 0
        try:
            while n < max_tokens:
                token = await tokens.get()
                if token is None:
                    yield sse({"error": {"message": f"deadline of {timeout} s passed before it started", "code": 504}})
                    return
                n += 1
                yield chunk(chr(token))
            yield chunk("", "length", usage={"prompt_tokens": len(prompt), "completion_tokens": n,
                                             "total_tokens": len(prompt) + n})
            yield "data: [DONE]\n\n"
        finally:  # done, expired, or the client went away (this generator is closed): cancel what still runs
            with served.lock:
                served.streams.pop(rid, None)
                if served.engine.status(rid) not in ENDED:
                    served.engine.cancel(rid)

    return StreamingResponse(stream(), media_type="text/event-stream")
