"""The platform in front of the course's model service (kit.platform_service): one process that supervises the
service, relays every completion to it with retries that cannot execute twice, and rolls a new version out
behind a canary, rolling it back when the canary finds it worse than the version serving now.

    python -m uvicorn gateway:app --uds SOCK       (the judge's command; sweep.py starts it the same way)

Write the TODOs: Backend.supervise, relay, rollout, Dispatcher. The rest is given.
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import uuid
from collections import deque
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from infracourse.kit.platform_service import (VERSION_ENV, BackendError, BackendLost, completion_events, probe,
                                              service_command)

RETRY_WINDOW_S = 45.0       # how long a request may wait for a service to come back before it is failed
READY_TIMEOUT_S = 60.0      # a service that does not answer /health this long after its start is restarted
CLASSES = ("A", "B")        # request classes, each with its own queue; unknown or none counts as A
# requests in flight at the service: its running slots and a little more, so that it never idles between two
SERVICE_SLOTS = json.loads(os.environ.get("INFRACOURSE_SERVE") or "{}").get("max_num_seqs", 16) + 2


def log(event: str, **fields) -> None:
    print(json.dumps({"ts": time.time(), "event": event, **fields}), flush=True)


class Backend:
    """One version of the service, kept running: restarted whenever its process exits, until `stop()`."""

    def __init__(self, version: str):
        self.version = version
        self.uds = os.path.join(os.getcwd(), f"svc-{version}.sock")
        self.ready = asyncio.Event()        # set while the service answers; clear while it is down
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.task = asyncio.create_task(self.supervise())

    async def supervise(self) -> None:
        """TODO: until self.stopping: start the service (asyncio.create_subprocess_exec(*service_command(self.uds),
        env={**os.environ, VERSION_ENV: self.version})), poll probe(self.uds, "/health") until it answers 200,
        set self.ready, wait for the process to exit (await self.proc.wait()), clear self.ready, and go round."""
        raise NotImplementedError("Backend.supervise: start the service and start it again whenever it exits")

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the service answers; re-raises what stopped `supervise`; TimeoutError after timeout_s."""
        ready = asyncio.create_task(self.ready.wait())
        done, _ = await asyncio.wait({self.task, ready}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if self.task in done:
            self.task.result()
            raise RuntimeError(f"the supervisor of {self.version} stopped")
        if not done:
            raise asyncio.TimeoutError(f"{self.version} not ready within {timeout_s:g} s")

    async def stop(self) -> None:
        self.stopping = True
        self.ready.clear()
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
        await asyncio.gather(self.task, return_exceptions=True)


class Dispatcher:
    """At most `slots` requests at the service at once; the others wait in their class's queue."""

    def __init__(self, slots: int):
        self.slots, self.busy = slots, 0
        self.queues: dict[str, deque] = {name: deque() for name in CLASSES}

    async def acquire(self, name: str) -> None:
        """TODO: return at once while fewer than `slots` are busy and nobody waits; otherwise wait in
        self.queues[name] (an asyncio future) until release() hands this request a slot."""
        raise NotImplementedError("Dispatcher.acquire: a queue per request class")

    def release(self) -> None:
        """TODO: free a slot and hand it on, taking the non-empty class queues in turn."""
        raise NotImplementedError("Dispatcher.release: hand the freed slot to the classes in turn")


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.dispatcher = Dispatcher(SERVICE_SLOTS)
    app.state.active = Backend("v1")
    app.state.rollouts, app.state.tasks = [], set()
    await app.state.active.wait_ready(READY_TIMEOUT_S)
    yield
    await app.state.active.stop()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health(request: Request):
    active: Backend = request.app.state.active
    return JSONResponse({"ready": active.ready.is_set(), "version": active.version},
                        status_code=200 if active.ready.is_set() else 503)


@app.get("/admin/status")
async def status(request: Request):
    return {"active": request.app.state.active.version, "rollouts": request.app.state.rollouts}


async def relay(request: Request, body: dict):
    """TODO: yield the service's events (dicts, as completion_events yields them) for `body`, each content chunk
    once. Send to request.app.state.active (wait for its .ready first) with an idempotency_key in the body. When
    completion_events raises BackendLost (or BackendError with a 5xx status), wait for a ready service and try
    again until RETRY_WINDOW_S has passed. A retried stream starts again from the first token. On giving up,
    yield {"error": {"message": ..., "code": 503}} and return."""
    raise NotImplementedError("relay: pass the service's stream on, retrying idempotently")
    yield  # noqa: unreachable - makes this an async generator


@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    name = body.pop("request_class", "A")
    name = name if name in CLASSES else "A"
    dispatcher: Dispatcher = request.app.state.dispatcher

    async def stream():
        await dispatcher.acquire(name)
        try:
            async for event in relay(request, body):
                yield f"data: {json.dumps(event)}\n\n"
                if "error" in event:
                    return
            yield "data: [DONE]\n\n"
        finally:
            dispatcher.release()

    return StreamingResponse(stream(), media_type="text/event-stream")


async def rollout(app: FastAPI, version: str) -> None:
    """TODO: start Backend(version) next to app.state.active, wait until it is ready, judge it with a canary
    (real completions to both versions: errors, median per-token time), then either make it app.state.active
    and stop the old one once it has finished what it holds, or stop it (roll back) and keep the old one.
    Append what happened to app.state.rollouts."""
    raise NotImplementedError("rollout: deploy the new version behind a canary, roll it back when it is worse")


@app.post("/admin/deploy")
async def deploy(request: Request):
    body = await request.json()
    version = body.get("version")
    if not isinstance(version, str) or not version:
        return JSONResponse({"error": "give {\"version\": \"v2\"}"}, status_code=400)
    task = asyncio.create_task(rollout(request.app, version))
    request.app.state.tasks.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(request.app.state.tasks.discard)
    return JSONResponse({"deploying": version}, status_code=202)
