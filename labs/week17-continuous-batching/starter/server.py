"""An OpenAI-style completions server over your engine, served by uvicorn:

    INFRACOURSE_SERVE='{"max_waiting": 32}' python -m uvicorn server:app --uds /tmp/s.sock

What it must do (README.md): POST /v1/completions streams one SSE event per token (text = chr(token id)),
then a last event with usage and `data: [DONE]`; a full queue answers 429 at once; a client that goes away, or
a request past its deadline (body `timeout_s`, else request_timeout_s), is aborted and its blocks freed.
GET /health answers 200; GET /debug/state answers the engine's state().
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


@asynccontextmanager
async def lifespan(app: FastAPI):
    torch.set_num_threads(1)  # a tiny model: one thread per step is steadier on a shared machine
    app.state.engine = Engine(ServeConfig.from_env())
    # TODO: run the engine's steps in their own thread (or between awaits), handing each token to its request
    yield


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.get("/debug/state")
async def state(request: Request):
    raise NotImplementedError("TODO: GET /debug/state answers the engine's state()")


@app.post("/v1/completions")
async def completions(request: Request):
    raise NotImplementedError("TODO: POST /v1/completions: validate, refuse (429) when the queue is full, queue the "
                              "sequence, stream its tokens as SSE events, abort it on disconnect or deadline")
