"""The model service: rate limits per client, a bounded queue, deadlines, health, readiness, metrics, logs.

    INFRACOURSE_SERVICE='{"load_delay_s": 2}' uvicorn server:app --uds /tmp/s.sock   (run.sh does this)
"""
from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from infracourse.kit.service_kit import ServiceConfig, ServiceModel
from limiter import ClientLimiter

cfg = ServiceConfig.from_env()
model = ServiceModel(cfg)
limiter = ClientLimiter(cfg.rate, cfg.burst)
executor = ThreadPoolExecutor(max_workers=cfg.max_concurrency)
slots = asyncio.Semaphore(cfg.max_concurrency)

OUTCOMES = ("ok", "rate_limited", "rejected", "timeout", "not_ready", "bad_request", "error")
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Counters by outcome, a latency histogram and the queue's depth, in the Prometheus text format."""

    def __init__(self):
        self.requests = {o: 0 for o in OUTCOMES}
        self.buckets = [0] * len(BUCKETS)
        self.count, self.sum = 0, 0.0
        self.queued = 0      # admitted, waiting for a generation slot
        self.running = 0     # generating

    def observe(self, outcome: str, seconds: float) -> None:
        self.requests[outcome] += 1
        self.count += 1
        self.sum += seconds
        for i, le in enumerate(BUCKETS):
            if seconds <= le:
                self.buckets[i] += 1

    def render(self) -> str:
        lines = ["# HELP service_requests_total Completion requests answered, by outcome.",
                 "# TYPE service_requests_total counter"]
        lines += [f'service_requests_total{{outcome="{o}"}} {n}' for o, n in self.requests.items()]
        lines += ["# HELP service_request_duration_seconds Time from arrival to answer, every outcome.",
                  "# TYPE service_request_duration_seconds histogram"]
        lines += [f'service_request_duration_seconds_bucket{{le="{le}"}} {n}' for le, n in zip(BUCKETS, self.buckets)]
        lines += [f'service_request_duration_seconds_bucket{{le="+Inf"}} {self.count}',
                  f"service_request_duration_seconds_sum {self.sum:.6f}",
                  f"service_request_duration_seconds_count {self.count}",
                  "# HELP service_queue_depth Requests waiting for a generation slot.",
                  "# TYPE service_queue_depth gauge", f"service_queue_depth {self.queued}",
                  "# HELP service_running_requests Requests generating.",
                  "# TYPE service_running_requests gauge", f"service_running_requests {self.running}"]
        return "\n".join(lines) + "\n"


metrics = Metrics()


def log(**fields) -> None:
    """One structured log line: a JSON object on stdout."""
    print(json.dumps({"ts": round(time.time(), 6), **fields}), file=sys.stdout, flush=True)


@asynccontextmanager
async def lifespan(app):
    # load in the background: liveness answers at once, readiness only once the model is there
    threading.Thread(target=load, daemon=True).start()
    yield


def load() -> None:
    log(event="load_started")
    model.load()
    log(event="load_finished")


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health():
    return {"status": "alive"}


@app.get("/ready")
async def ready():
    if not model.loaded:
        return JSONResponse({"ready": False}, status_code=503)
    return {"ready": True}


@app.get("/metrics")
async def get_metrics():
    return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")


def answer(rid: str, client: str, started: float, status: int, outcome: str, content: dict, **headers):
    latency = time.perf_counter() - started
    metrics.observe(outcome, latency)
    log(event="request", request_id=rid, client=client, status=status, outcome=outcome,
        latency_ms=round(latency * 1000, 3))
    return JSONResponse(content, status_code=status, headers={"X-Request-Id": rid, **headers})


@app.post("/v1/completions")
async def completions(request: Request):
    started = time.perf_counter()
    rid = uuid.uuid4().hex
    client = request.headers.get("x-client-id", "anonymous")
    try:
        body = await request.json()
        prompt, max_tokens = body["prompt"], int(body.get("max_tokens", 16))
        timeout = float(body.get("timeout_s", cfg.request_timeout_s))
    except (ValueError, KeyError, TypeError) as exc:
        return answer(rid, client, started, 400, "bad_request", {"error": f"bad request: {exc}"})
    if not model.loaded:
        return answer(rid, client, started, 503, "not_ready", {"error": "the model is still loading"},
                      **{"Retry-After": "1"})
    admitted, wait = limiter.check(client)
    if not admitted:
        return answer(rid, client, started, 429, "rate_limited", {"error": "rate limit exceeded"},
                      **{"Retry-After": str(max(1, math.ceil(wait)))})
    # the queue itself is the bound: a slot being handed from a finished request to a waiting one leaves
    # `running` one short for a moment, so "queued + running < total" would let a 7th request into a queue of 6
    if metrics.queued >= cfg.max_queue:
        return answer(rid, client, started, 503, "rejected", {"error": "queue full, try again later"},
                      **{"Retry-After": "1"})
    cancel, state = threading.Event(), {"queued": True}
    metrics.queued += 1  # counted at once: the next request's admission sees it
    try:
        left = timeout - (time.perf_counter() - started)
        tokens = await asyncio.wait_for(generate(prompt, max_tokens, cancel, state), left)
    except asyncio.TimeoutError:
        cancel.set()
        return answer(rid, client, started, 504, "timeout", {"error": f"deadline of {timeout} s passed"})
    except ValueError as exc:
        return answer(rid, client, started, 400, "bad_request", {"error": str(exc)})
    except Exception as exc:  # noqa: BLE001 - a failure is an answer, counted and logged like any other
        return answer(rid, client, started, 500, "error", {"error": f"{type(exc).__name__}: {exc}"})
    finally:
        if state["queued"]:  # ended (deadline) before it got a slot
            metrics.queued -= 1
    return answer(rid, client, started, 200, "ok", {"id": rid, "tokens": tokens, "text": model.text(tokens),
                                                    "usage": {"completion_tokens": len(tokens)}})


async def generate(prompt, max_tokens: int, cancel: threading.Event, state: dict) -> list[int]:
    """Wait for a slot (queued), then generate in a worker thread (running)."""
    async with slots:
        metrics.queued -= 1
        state["queued"] = False
        metrics.running += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, model.generate, prompt, max_tokens, cancel)
        finally:
            metrics.running -= 1
