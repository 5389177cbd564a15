"""The platform in front of the course's model service (kit.platform_service): one process that supervises the
service, keeps two request classes apart (interactive first; batch held to its quota of the service's slots),
refuses what it cannot serve soon (429 at once, never an endless queue), and relays every completion with
retries that cannot execute twice.

    python -m uvicorn gateway:app --uds SOCK       (the judge's command; run.py and sweep.py start it the same way)

Write the TODOs: Backend.supervise, Classes.acquire / release, relay. Your week 21 gateway has most of it.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import deque
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from infracourse.kit.platform_service import (BackendError, BackendLost, class_limits, completion_events, probe,
                                              service_command)

RETRY_WINDOW_S = 45.0       # how long a request may wait for a service to come back before it is failed
READY_TIMEOUT_S = 60.0      # a service that does not answer /health this long after its start is restarted
SERVICE_SLOTS = json.loads(os.environ.get("INFRACOURSE_SERVE") or "{}").get("max_num_seqs", 4)


def log(event: str, **fields) -> None:
    print(json.dumps({"ts": time.time(), "event": event, **fields}), flush=True)


class Backend:
    """The service, kept running: restarted whenever its process exits, until `stop()`."""

    def __init__(self):
        self.uds = os.path.join(os.getcwd(), "svc.sock")   # absolute: the judge reads its /debug/state
        self.ready = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.task = asyncio.create_task(self.supervise())

    async def supervise(self) -> None:
        """TODO: until self.stopping: start the service (asyncio.create_subprocess_exec(*service_command(self.uds),
        env=dict(os.environ))), poll probe(self.uds, "/health") until it answers 200, set self.ready, wait for the
        process to exit (await self.proc.wait()), clear self.ready, and go round."""
        raise NotImplementedError("Backend.supervise: start the service and start it again whenever it exits")

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the service answers; re-raises what stopped `supervise`; TimeoutError after timeout_s."""
        ready = asyncio.create_task(self.ready.wait())
        done, _ = await asyncio.wait({self.task, ready}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if self.task in done:
            self.task.result()
            raise RuntimeError("the supervisor stopped")
        if not done:
            raise asyncio.TimeoutError(f"the service was not ready within {timeout_s:g} s")

    async def stop(self) -> None:
        self.stopping = True
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
        await asyncio.gather(self.task, return_exceptions=True)


class Overloaded(Exception):
    """The class's queue is full: the request is refused now rather than left waiting."""


class Classes:
    """The service's slots shared by two classes under class_limits(): batch holds at most limits["batch_slots"],
    each class waits in its own queue bounded by limits["batch_queue"] / limits["interactive_queue"]."""

    def __init__(self, slots: int, limits: dict):
        self.slots, self.limits = slots, limits

    async def acquire(self, name: str) -> None:
        """TODO: return when a request of class `name` may go to the service (it then holds one slot); raise
        Overloaded at once when its queue is full or its quota is 0. Interactive goes first when a slot frees;
        batch never holds more than its quota, and interactive leaves batch its share while batch has work."""
        raise NotImplementedError("Classes.acquire: a queue and a slot count per class")

    def release(self, name: str) -> None:
        """TODO: the request of class `name` has finished: free its slot and hand it to the next waiter."""
        raise NotImplementedError("Classes.release: hand the freed slot on, interactive first")


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.classes = Classes(SERVICE_SLOTS, class_limits())
    app.state.backend = Backend()
    await app.state.backend.wait_ready(READY_TIMEOUT_S)
    yield
    await app.state.backend.stop()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health(request: Request):
    ready = request.app.state.backend.ready.is_set()
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


async def relay(request: Request, body: dict):
    """TODO: yield the service's events for `body` (completion_events(backend.uds, {...})), each content chunk
    delivered once. Draw one idempotency key per client request, BEFORE the retry loop, and send it in every
    attempt; when the stream breaks (BackendLost, or BackendError >= 500) wait for backend.ready and try again,
    skipping the content chunks the client already has; yield {"error": {...}} when it is hopeless."""
    raise NotImplementedError("relay: stream from the service, retrying with one idempotency key")
    yield  # noqa: unreachable - makes this an async generator


@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    name = body.pop("request_class", None) or "interactive"
    if name not in ("interactive", "batch"):
        return JSONResponse({"error": {"message": f"unknown request_class {name!r}"}}, status_code=400)
    classes: Classes = request.app.state.classes
    try:
        await classes.acquire(name)  # before the response starts: a refusal is a status, at once
    except Overloaded as exc:
        return JSONResponse({"error": {"message": str(exc)}}, status_code=429, headers={"Retry-After": "1"})

    async def stream():
        try:
            async for event in relay(request, body):
                yield f"data: {json.dumps(event)}\n\n"
                if "error" in event:
                    return
            yield "data: [DONE]\n\n"
        finally:
            classes.release(name)

    return StreamingResponse(stream(), media_type="text/event-stream")
