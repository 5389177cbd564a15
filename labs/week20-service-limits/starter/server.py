"""The model service: rate limits per client, a bounded queue, deadlines, health, readiness, metrics, logs.

    INFRACOURSE_SERVICE='{"load_delay_s": 2}' uvicorn server:app --uds /tmp/s.sock   (run.sh does this)

The contract (README.md has it in full):
  POST /v1/completions  JSON {"prompt": [ids] or "text", "max_tokens": n, "timeout_s": optional}, header
                        X-Client-Id. 200 {"tokens": [...], "text": ...}; 429 + Retry-After (rate limit);
                        503 (queue full, or not ready); 504 (deadline passed); 400 (bad request).
                        Every answer: an X-Request-Id header and one JSON log line on stdout.
  GET /health           200 whenever the process serves (liveness)
  GET /ready            503 until the model is loaded, then 200 (readiness)
  GET /metrics          Prometheus text: service_requests_total{outcome=...}, service_request_duration_seconds
                        (histogram), service_queue_depth (gauge)
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

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from infracourse.kit.service_kit import ServiceConfig, ServiceModel
from limiter import ClientLimiter

cfg = ServiceConfig.from_env()
model = ServiceModel(cfg)
limiter = ClientLimiter(cfg.rate, cfg.burst)
executor = ThreadPoolExecutor(max_workers=cfg.max_concurrency)  # model.generate blocks: run it here

OUTCOMES = ("ok", "rate_limited", "rejected", "timeout", "not_ready", "bad_request", "error")
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def log(**fields) -> None:
    """One structured log line: a JSON object on stdout."""
    print(json.dumps({"ts": round(time.time(), 6), **fields}), file=sys.stdout, flush=True)


# TODO: start model.load() without blocking the server (FastAPI(lifespan=...) and a thread)
app = FastAPI()


@app.get("/health")
async def health():
    raise NotImplementedError("GET /health: liveness, 200 whenever the process serves")


@app.get("/ready")
async def ready():
    raise NotImplementedError("GET /ready: readiness, 503 until model.loaded, then 200")


@app.get("/metrics")
async def get_metrics():
    raise NotImplementedError("GET /metrics: the counters, histogram and queue gauge in the Prometheus text format")


@app.post("/v1/completions")
async def completions(request: Request):
    raise NotImplementedError("POST /v1/completions: rate limit, bounded queue, deadline, generate, count and log")
