"""The platform in front of the course's model service (kit.platform_service): one process that supervises the
service, relays every completion to it with retries that cannot execute twice, and rolls a new version out
behind a canary, rolling it back when the canary sees it worse than the version serving now.

    python -m uvicorn gateway:app --uds SOCK       (the judge's command; sweep.py starts it the same way)
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
CANARY_PROBES = 10          # requests sent to each of the old and the new version before any user traffic moves
CANARY_SLOWER = 1.5         # the new version's median per-token time may be at most this times the old one's
CANARY_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
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
        self.ready = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.starts = 0
        self.task = asyncio.create_task(self.supervise())

    async def supervise(self) -> None:
        while not self.stopping:
            if os.path.exists(self.uds):
                os.unlink(self.uds)
            env = {**os.environ, VERSION_ENV: self.version}
            self.proc = await asyncio.create_subprocess_exec(*service_command(self.uds), env=env)
            self.starts += 1
            log("service_started", version=self.version, pid=self.proc.pid, start=self.starts)
            waiter = asyncio.create_task(self.proc.wait())
            began = time.monotonic()
            while not waiter.done() and time.monotonic() - began < READY_TIMEOUT_S:
                if (await probe(self.uds, "/health"))[0] == 200:
                    self.ready.set()
                    log("service_ready", version=self.version, pid=self.proc.pid,
                        seconds=round(time.monotonic() - began, 3))
                    break
                await asyncio.sleep(0.05)
            else:
                if not waiter.done():
                    self.proc.kill()
            code = await waiter
            self.ready.clear()
            log("service_exited", version=self.version, pid=self.proc.pid, code=code)
            await asyncio.sleep(0.05)

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
    """At most `slots` requests at the service; the rest wait in their class's queue, and a freed slot goes to
    the classes in turn, so a flood of one class cannot starve the other."""

    def __init__(self, slots: int):
        self.slots, self.busy, self.turn = slots, 0, 0
        self.queues: dict[str, deque] = {name: deque() for name in CLASSES}

    async def acquire(self, name: str) -> None:
        if self.busy < self.slots and not any(self.queues.values()):
            self.busy += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.queues[name].append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter in self.queues[name]:
                self.queues[name].remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self.release()
            raise

    def release(self) -> None:
        self.busy -= 1
        while self.busy < self.slots:
            for queue in self.queues.values():
                while queue and queue[0].done():  # a waiter cancelled meanwhile
                    queue.popleft()
            order = CLASSES[self.turn % len(CLASSES):] + CLASSES[:self.turn % len(CLASSES)]
            queue = next((self.queues[name] for name in order if self.queues[name]), None)
            if queue is None:
                return
            self.turn += 1
            self.busy += 1
            queue.popleft().set_result(None)


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
    """The service's events for `body`, delivered once each: one idempotency key for every attempt, so a retry
    after a lost answer is served from the service's table, never computed again; the tokens a broken attempt
    already delivered are skipped in the next."""
    key = str(uuid.uuid4())
    delivered, deadline = 0, time.monotonic() + RETRY_WINDOW_S
    while True:
        backend: Backend = request.app.state.active
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


async def canary_sample(backend: Backend) -> dict:
    """Errors and per-token times of CANARY_PROBES requests to one backend."""
    errors, tpots = 0, []
    for _ in range(CANARY_PROBES):
        times = []
        try:
            async for event in completion_events(backend.uds, {"prompt": CANARY_PROMPT, "max_tokens": 8}):
                if (event.get("choices") or [{}])[0].get("text"):
                    times.append(time.perf_counter())
            tpots.append((times[-1] - times[0]) / (len(times) - 1))
        except (BackendLost, BackendError, IndexError, ZeroDivisionError):
            errors += 1
    return {"errors": errors, "tpot_s": statistics.median(tpots) if tpots else float("inf")}


async def rollout(app: FastAPI, version: str) -> None:
    record = {"version": version, "started": time.time(), "outcome": "starting"}
    app.state.rollouts.append(record)
    old: Backend = app.state.active
    new = Backend(version)
    try:
        await new.wait_ready(READY_TIMEOUT_S)
    except (asyncio.TimeoutError, RuntimeError):
        record["outcome"] = "rolled back: never ready"
        await new.stop()
        return
    baseline, canary = await asyncio.gather(canary_sample(old), canary_sample(new))
    record.update(baseline=baseline, canary=canary)
    if canary["errors"] > 0 or canary["tpot_s"] > CANARY_SLOWER * baseline["tpot_s"]:
        record["outcome"] = "rolled back"
        log("rollback", **record)
        await new.stop()
        return
    app.state.active = new  # new requests go to the new version; the old one finishes what it holds
    record["outcome"] = "promoted"
    log("promoted", **record)
    await asyncio.sleep(RETRY_WINDOW_S)
    await old.stop()


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
