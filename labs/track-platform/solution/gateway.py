"""The platform in front of the course's model service (kit.platform_service): one process that supervises the
service, keeps two request classes apart (interactive first; batch held to its quota of the service's slots),
refuses what it cannot serve soon (429 at once, never an endless queue), and relays every completion with
retries that cannot execute twice.

    python -m uvicorn gateway:app --uds SOCK       (the judge's command; run.py and sweep.py start it the same way)
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
# the service runs max_num_seqs sequences at once; the gateway never sends more, so the service's own FIFO
# stays empty and the order of service is the gateway's
SERVICE_SLOTS = json.loads(os.environ.get("INFRACOURSE_SERVE") or "{}").get("max_num_seqs", 4)


def log(event: str, **fields) -> None:
    print(json.dumps({"ts": time.time(), "event": event, **fields}), flush=True)


class Backend:
    """The service, kept running: restarted whenever its process exits, until `stop()`."""

    def __init__(self):
        self.uds = os.path.join(os.getcwd(), "svc.sock")
        self.ready = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.task = asyncio.create_task(self.supervise())

    async def supervise(self) -> None:
        while not self.stopping:
            if os.path.exists(self.uds):
                os.unlink(self.uds)
            self.proc = await asyncio.create_subprocess_exec(*service_command(self.uds), env=dict(os.environ))
            log("service_started", pid=self.proc.pid)
            waiter = asyncio.create_task(self.proc.wait())
            began = time.monotonic()
            while not waiter.done() and time.monotonic() - began < READY_TIMEOUT_S:
                if (await probe(self.uds, "/health"))[0] == 200:
                    self.ready.set()
                    log("service_ready", pid=self.proc.pid, seconds=round(time.monotonic() - began, 3))
                    break
                await asyncio.sleep(0.05)
            else:
                if not waiter.done():
                    self.proc.kill()
            code = await waiter
            self.ready.clear()
            log("service_exited", pid=self.proc.pid, code=code)

    async def stop(self) -> None:
        self.stopping = True
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
        await asyncio.gather(self.task, return_exceptions=True)


class Overloaded(Exception):
    """The class's queue is full: the request is refused now rather than left waiting."""


class Classes:
    """Counting semaphores per class over the service's slots. Batch holds at most `batch_slots` of them;
    interactive may take the rest, and batch's share too while no batch request wants it. A freed slot goes
    to interactive first. Each class waits in its own bounded queue."""

    def __init__(self, slots: int, limits: dict):
        self.slots = slots
        self.quota = {"interactive": slots, "batch": min(limits["batch_slots"], slots)}
        self.bound = {"interactive": limits["interactive_queue"], "batch": limits["batch_queue"]}
        self.busy = {"interactive": 0, "batch": 0}
        self.queues: dict[str, deque] = {"interactive": deque(), "batch": deque()}
        self.waited: dict[str, float] = {"interactive": 0.0, "batch": 0.0}   # seconds spent queued, per class

    def _may_start(self, name: str) -> bool:
        if sum(self.busy.values()) >= self.slots or self.busy[name] >= self.quota[name]:
            return False
        if name == "interactive":  # keep batch's share for batch while batch has work
            wanted = min(self.quota["batch"], self.busy["batch"] + len(self.queues["batch"]))
            return self.busy["interactive"] + max(wanted, self.busy["batch"]) < self.slots
        return True

    async def acquire(self, name: str) -> None:
        if not self.queues[name] and self._may_start(name):
            self.busy[name] += 1
            return
        if self.quota[name] == 0 or len(self.queues[name]) >= self.bound[name]:
            raise Overloaded(f"{name} queue full ({len(self.queues[name])} waiting, quota {self.quota[name]})")
        waiter = asyncio.get_running_loop().create_future()
        self.queues[name].append(waiter)
        began = time.perf_counter()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter in self.queues[name]:
                self.queues[name].remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self.release(name)
            raise
        finally:
            self.waited[name] += time.perf_counter() - began

    def release(self, name: str) -> None:
        self.busy[name] -= 1
        self._grant()

    def _grant(self) -> None:
        for name in ("interactive", "batch"):
            queue = self.queues[name]
            while queue and queue[0].done():  # a waiter cancelled meanwhile
                queue.popleft()
            while queue and self._may_start(name):
                self.busy[name] += 1
                queue.popleft().set_result(None)
                while queue and queue[0].done():
                    queue.popleft()


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.classes = Classes(SERVICE_SLOTS, class_limits())
    app.state.backend = Backend()
    try:
        await asyncio.wait_for(app.state.backend.ready.wait(), READY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise RuntimeError(f"the course service did not answer /health within {READY_TIMEOUT_S:g} s") from None
    yield
    await app.state.backend.stop()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health(request: Request):
    ready = request.app.state.backend.ready.is_set()
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


@app.get("/admin/classes")
async def classes_state(request: Request):
    c: Classes = request.app.state.classes
    return {"quota": c.quota, "busy": c.busy, "waiting": {k: len(q) for k, q in c.queues.items()},
            "queued_seconds": c.waited}


@app.post("/admin/classes")
async def set_limits(request: Request):
    """Change the class limits at run time (run.py's failure case: a batch quota set too low)."""
    c: Classes = request.app.state.classes
    body = await request.json()
    if "batch_slots" in body:
        c.quota["batch"] = min(int(body["batch_slots"]), c.slots)
    for name in ("interactive", "batch"):
        if f"{name}_queue" in body:
            c.bound[name] = int(body[f"{name}_queue"])
    c._grant()
    return {"quota": c.quota, "bound": c.bound}


async def relay(request: Request, body: dict):
    """The service's events for `body`, delivered once each: one idempotency key for every attempt, so a retry
    after a lost answer is served from the service's table, never computed again; the tokens a broken attempt
    already delivered are skipped in the next."""
    key = str(uuid.uuid4())
    backend: Backend = request.app.state.backend
    delivered, deadline = 0, time.monotonic() + RETRY_WINDOW_S
    while True:
        try:
            await asyncio.wait_for(backend.ready.wait(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            yield {"error": {"message": f"no service ready within {RETRY_WINDOW_S:g} s", "code": 503}}
            return
        seen = 0
        try:
            async for event in completion_events(backend.uds, {**body, "idempotency_key": key}):
                text = (event.get("choices") or [{}])[0].get("text")
                if text:
                    seen += 1
                    if seen <= delivered:
                        continue
                    delivered += 1
                yield event
            return
        except (BackendLost, BackendError) as exc:
            if isinstance(exc, BackendError) and exc.status < 500:
                yield {"error": {"message": str(exc), "code": exc.status}}
                return
            if time.monotonic() > deadline:
                yield {"error": {"message": f"gave up after {RETRY_WINDOW_S:g} s: {exc}", "code": 503}}
                return
            log("retry", key=key, delivered=delivered, reason=str(exc)[:200])
            await asyncio.sleep(0.05)


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
