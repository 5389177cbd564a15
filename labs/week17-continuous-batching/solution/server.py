"""An OpenAI-style completions server over the continuous-batching engine, served by uvicorn:

    INFRACOURSE_SERVE='{"max_waiting": 32}' python -m uvicorn server:app --uds /tmp/s.sock

The engine runs in its own thread, so the event loop keeps accepting and streaming while a step computes:
requests and aborts reach it through two inboxes, tokens come back to each request's asyncio queue.
POST /v1/completions streams one SSE event per token; a full queue answers 429 at once; a client that goes
away, or a request past its deadline, is aborted and its blocks freed. GET /health, GET /debug/state.
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine import Engine, Sequence
from infracourse.kit.batching import SERVE_GPT, ServeConfig


class EngineThread:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.arrivals: queue.SimpleQueue[Sequence] = queue.SimpleQueue()   # filled by the event loop
        self.aborts: queue.SimpleQueue[Sequence] = queue.SimpleQueue()
        self.streams: dict[int, asyncio.Queue] = {}

    def queued(self) -> int:
        """Requests waiting: in the engine's queue, or handed in and not yet taken by the engine."""
        return len(self.engine.waiting) + self.arrivals.qsize()

    def take(self, inbox: queue.SimpleQueue, block: bool):
        try:
            return inbox.get(block=block, timeout=0.05 if block else None)
        except queue.Empty:
            return None

    def run(self) -> None:
        while True:
            while (seq := self.take(self.aborts, block=False)) is not None:
                self.engine.abort(seq)
            idle = not self.engine.has_work()  # when idle, wait (briefly, to see aborts too) for an arrival
            while (seq := self.take(self.arrivals, block=idle)) is not None:
                self.engine.add(seq)
                idle = False
            for seq, token, finished in self.engine.step():
                stream = self.streams.get(seq.id)
                if stream is not None:
                    self.loop.call_soon_threadsafe(stream.put_nowait, (token, finished))


@asynccontextmanager
async def lifespan(app: FastAPI):
    torch.set_num_threads(1)  # a tiny model: one thread per step is steadier on a shared machine
    app.state.engine = EngineThread(Engine(ServeConfig.from_env()), asyncio.get_running_loop())
    threading.Thread(target=app.state.engine.run, daemon=True).start()
    yield


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.get("/debug/state")
async def state(request: Request):
    return request.app.state.engine.engine.state()


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


@app.post("/v1/completions")
async def completions(request: Request):
    engine: EngineThread = request.app.state.engine
    cfg = engine.engine.cfg
    body = await request.json()
    prompt, max_tokens = body.get("prompt"), body.get("max_tokens", 16)
    if isinstance(prompt, str):
        prompt = list(prompt.encode())
    if not (isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < SERVE_GPT.vocab_size
                                                        for t in prompt)):
        return error(400, f"prompt must be a non-empty list of token ids below {SERVE_GPT.vocab_size}")
    if type(max_tokens) is not int or max_tokens < 1 or len(prompt) + max_tokens > SERVE_GPT.seq_len:
        return error(400, f"max_tokens must be >= 1 and prompt + max_tokens <= {SERVE_GPT.seq_len}")
    if engine.queued() >= cfg.max_waiting:  # bounded queue: refuse now rather than let every latency grow
        return error(429, f"{engine.queued()} requests already wait; try again later")
    timeout = body.get("timeout_s", cfg.request_timeout_s)  # a deadline of its own, or the server's
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return error(400, "timeout_s must be a number of seconds > 0")
    expires_at = time.monotonic() + timeout
    seq = Sequence(prompt, max_tokens)
    tokens = engine.streams[seq.id] = asyncio.Queue()
    engine.arrivals.put(seq)
    rid, created = f"cmpl-{seq.id}", int(time.time())

    def chunk(text: str, finish: str | None = None, **extra) -> str:
        return sse({"id": rid, "object": "text_completion", "created": created, "model": "kit-gpt",
                    "choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra})

    async def stream():
        try:
            finished, n = False, 0
            while not finished:
                token, finished = await asyncio.wait_for(tokens.get(), expires_at - time.monotonic())
                n += 1
                yield chunk(chr(token))  # vocabulary 128: one ASCII character per token
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            yield chunk("", "length", usage=usage)
            yield "data: [DONE]\n\n"
        except asyncio.TimeoutError:
            yield sse({"error": {"message": f"timed out after {timeout} s", "code": 504}})
        finally:  # finished, timed out, or the client went away (the stream is cancelled): free its blocks
            engine.streams.pop(seq.id, None)
            engine.aborts.put(seq)

    return StreamingResponse(stream(), media_type="text/event-stream")
