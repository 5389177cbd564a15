"""A load generator for OpenAI-style streaming `/v1/completions` servers, and the serving metrics exactly as
vLLM's serving benchmark (`vllm bench serve`, benchmarks/serve.py `calculate_metrics`) defines them.

The client is plain asyncio (no HTTP library needed). Sending and measuring are separate. Sending produces
one `RequestRecord` per request; the metrics are pure
functions of those records, so they are tested on fixed traces:

    specs = request_matrix(input_lens=[16, 64], output_lens=[8, 32], per_cell=4, vocab_size=256, seed=0)
    records, duration_s = run_load(specs, uds="/tmp/x/server.sock",       # or base_url="http://127.0.0.1:8000"
                                   rate=float("inf"), burstiness=1.0, concurrency=8, seed=0)
    m = compute_metrics(records, duration_s, percentiles=(50, 90, 99), goodput_slo_ms={"ttft": 200, "tpot": 50})
    m["ttft_ms"]["p99"], m["output_throughput"], m["request_goodput"]

Definitions (times in seconds in records, milliseconds in the metrics, as vLLM prints them):
  chunk     an SSE event `data: {...}` whose choices[0].text is non-empty (a content chunk); `data: [DONE]` ends
  TTFT      first content chunk's arrival - send time
  ITL       gaps between consecutive content chunks of a request, pooled over all successful requests
  E2EL      last content chunk's arrival - send time
  TPOT      per request (E2EL - TTFT) / (output_tokens - 1), only requests with output_tokens > 1 enter its
            statistics; for goodput a request with output_tokens <= 1 counts TPOT 0
  output_tokens  usage.completion_tokens of the stream when the server sends it, else the content chunks counted
  throughputs    completed / duration, sum(output_tokens of successful requests) / duration, and
            (input + output tokens) / duration; failed requests are excluded (count 0 tokens)
  goodput   successful requests meeting EVERY given SLO (value <= SLO ms, for keys ttft, tpot, e2el) / duration
  failure rate   failed / all requests sent (vLLM prints the failed count; the rate is the course's)
  percentiles    np.percentile (linear interpolation); mean, median, std as np.mean, np.median, np.std; a metric
            with no sample reports 0 (vLLM's `or 0`)
Arrivals (vLLM's get_request): request i is sent at the sum of i gaps drawn from Gamma(shape=burstiness,
scale=1 / (rate * burstiness)); burstiness 1 is a Poisson process, < 1 burstier, rate=inf sends all at once;
`concurrency` caps requests in flight (a semaphore, requests wait for a slot after their arrival time).
Transports: HTTP (TCP or a Unix socket) by default; `send=` takes any coroutine spec -> RequestRecord, e.g. an
in-process engine's stream recorded by `record_stream`. The load matrix over these is kit/load_matrix.py;
docs/serving-metrics.md states every definition once.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import math
import random
import socket
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from urllib.parse import urlsplit

import numpy as np

SLO_KEYS = ("ttft", "tpot", "e2el")


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix domain socket (a sandboxed server listens on one), for plain requests."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


@dataclass
class RequestSpec:
    prompt_ids: list[int]
    max_tokens: int


@dataclass
class RequestRecord:
    """What one request did, on the client's clock (time.perf_counter seconds)."""
    prompt_tokens: int
    send_time: float
    chunk_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    output_tokens: int = 0
    success: bool = False
    error: str = ""
    text: str = ""

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.send_time

    @property
    def e2el(self) -> float:
        return self.chunk_times[-1] - self.send_time

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float | None:
        """(E2EL - TTFT) / (output_tokens - 1); None when output_tokens <= 1."""
        if self.output_tokens <= 1:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


def _stats(values: Sequence[float], percentiles: Iterable[float]) -> dict:
    """ms statistics as vLLM computes them: an empty list counts as [0]."""
    v = np.asarray(values if len(values) else [0.0], dtype=np.float64) * 1000.0
    out = {"mean": float(np.mean(v)), "median": float(np.median(v)), "std": float(np.std(v))}
    for p in percentiles:
        out[f"p{p:g}"] = float(np.percentile(v, p))  # numpy's default method: linear
    return out


def compute_metrics(records: Sequence[RequestRecord], duration_s: float, *,
                    percentiles: Iterable[float] = (50, 90, 95, 99),
                    goodput_slo_ms: dict[str, float] | None = None) -> dict:
    """The serving metrics of `records` over a benchmark of `duration_s` seconds (see the module docstring).

    Returns a dict: completed, failed, failure_rate, total_input, total_output, duration_s, request_throughput,
    output_throughput, total_token_throughput, request_goodput (None without SLOs), and ttft_ms, tpot_ms,
    itl_ms, e2el_ms: each {mean, median, std, p50, ...}."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    percentiles = tuple(percentiles)
    slo = dict(goodput_slo_ms or {})
    unknown = set(slo) - set(SLO_KEYS)
    if unknown:
        raise ValueError(f"goodput SLO keys must be among {SLO_KEYS}, got {sorted(unknown)}")
    ttfts, tpots, all_tpots, itls, e2els = [], [], [], [], []
    completed = total_input = total_output = good = 0
    for r in records:
        if not r.success:
            continue
        if not r.chunk_times:
            raise ValueError("a successful RequestRecord must have at least one content chunk time")
        completed += 1
        total_input += r.prompt_tokens
        total_output += r.output_tokens
        tpot = r.tpot
        if tpot is not None:
            tpots.append(tpot)
        all_tpots.append(tpot or 0.0)
        itls.extend(r.itl)
        ttfts.append(r.ttft)
        e2els.append(r.e2el)
        values = {"ttft": r.ttft, "tpot": tpot or 0.0, "e2el": r.e2el}
        if slo and all(values[k] <= slo[k] / 1000.0 for k in slo):
            good += 1
    return {
        "completed": completed, "failed": len(records) - completed,
        "failure_rate": (len(records) - completed) / len(records) if records else 0.0,
        "total_input": total_input, "total_output": total_output, "duration_s": duration_s,
        "request_throughput": completed / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "request_goodput": good / duration_s if slo else None,
        "ttft_ms": _stats(ttfts, percentiles), "tpot_ms": _stats(tpots, percentiles),
        "itl_ms": _stats(itls, percentiles), "e2el_ms": _stats(e2els, percentiles),
    }


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, *, seed: int = 0) -> list[float]:
    """Send times (s, from the start) of n requests: 0 first, then cumulative Gamma(burstiness, 1/(rate*b))
    gaps; rate=inf gives all zeros."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if not (rate > 0 and burstiness > 0):
        raise ValueError(f"rate and burstiness must be > 0, got {rate}, {burstiness}")
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def request_matrix(input_lens: Sequence[int], output_lens: Sequence[int], per_cell: int, *, vocab_size: int = 256,
                   seed: int = 0, shuffle: bool = True) -> list[RequestSpec]:
    """per_cell requests for every (input length, output length) pair, random prompt ids from the seed."""
    r = random.Random(seed)
    specs = [RequestSpec([r.randrange(vocab_size) for _ in range(i)], o)
             for i in input_lens for o in output_lens for _ in range(per_cell)]
    if shuffle:
        r.shuffle(specs)
    return specs


def _body(spec: RequestSpec, model: str, prompt_as: str, extra: dict | None) -> dict:
    if prompt_as == "ids":
        prompt = list(spec.prompt_ids)
    elif prompt_as == "text":
        prompt = bytes(spec.prompt_ids).decode("utf-8", errors="replace")
    else:
        raise ValueError(f"prompt_as must be 'ids' or 'text', got {prompt_as!r}")
    body = {"model": model, "prompt": prompt, "max_tokens": spec.max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    body.update(extra or {})
    return body


async def _open(base_url: str, uds: str | None):
    if uds:
        return await asyncio.open_unix_connection(uds)
    u = urlsplit(base_url)
    if u.scheme != "http":
        raise ValueError(f"only http:// base URLs are supported, got {base_url!r}")
    return await asyncio.open_connection(u.hostname or "localhost", u.port or 80)


async def body_pieces(reader, headers: dict):
    """The response body as it arrives: chunked transfer encoding, Content-Length, or until the server closes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)  # CRLF after each chunk
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while piece := await reader.read(65536):
            yield piece


async def stream_lines(reader, headers: dict):
    buf = b""
    async for piece in body_pieces(reader, headers):
        buf += piece
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", errors="replace")
    if buf:
        yield buf.decode("utf-8", errors="replace")


async def send_completion(spec: RequestSpec, *, base_url: str = "http://localhost", uds: str | None = None,
                          endpoint: str = "/v1/completions", model: str = "kit-gpt", prompt_as: str = "ids",
                          extra_body: dict | None = None) -> RequestRecord:
    """One streaming request on its own HTTP/1.1 connection (TCP, or the Unix socket `uds`); a server's fault
    (refused, HTTP error, malformed or unfinished stream) is recorded in the record's `error`, never raised.
    Dependency-free: plain asyncio streams, so it runs wherever the course runs."""
    payload_bytes = json.dumps(_body(spec, model, prompt_as, extra_body)).encode()
    host = "localhost" if uds else (urlsplit(base_url).netloc or "localhost")
    request = (f"POST {endpoint} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Accept: text/event-stream\r\nContent-Length: {len(payload_bytes)}\r\nConnection: close\r\n\r\n"
               ).encode() + payload_bytes
    rec = RequestRecord(prompt_tokens=len(spec.prompt_ids), send_time=time.perf_counter())
    usage_tokens, parts, writer = None, [], None
    try:
        reader, writer = await _open(base_url, uds)
        rec.send_time = time.perf_counter()  # the clock starts as the request leaves, connection made
        writer.write(request)
        await writer.drain()
        status = (await reader.readline()).decode("latin-1").split()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if len(status) < 2 or status[1] != "200":
            body = b"".join([p async for p in body_pieces(reader, headers)]) if status else b""
            rec.error = f"HTTP {' '.join(status[1:]) or '(no status line)'}: {body[:300]!r}"
            return rec
        done = False
        async for line in stream_lines(reader, headers):
            line = line.strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                done = True
                break
            now = time.perf_counter()
            data = json.loads(payload)
            choices = data.get("choices") or []
            text = choices[0].get("text") if choices else None
            if text:
                rec.chunk_times.append(now)
                parts.append(text)
            usage = data.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                usage_tokens = int(usage["completion_tokens"])
        if not done:
            rec.error = "stream ended without data: [DONE]"
        elif not rec.chunk_times:
            rec.error = "no content chunk in the stream"
        else:
            rec.success = True
    except Exception as exc:  # noqa: BLE001 - a failed request is data, not a crash of the benchmark
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if writer is not None:
            writer.close()
        rec.text = "".join(parts)
        rec.output_tokens = (usage_tokens if usage_tokens is not None else len(rec.chunk_times)) if rec.success else 0
    return rec


async def record_stream(spec: RequestSpec, pieces: AsyncIterator[str]) -> RequestRecord:
    """The record of one request served in process: `pieces` yields the output text as it is produced (one
    piece per token); the clock starts before the first piece is asked for. An exception in the stream is the
    request's failure (recorded, not raised), as a server's fault is for send_completion."""
    rec = RequestRecord(prompt_tokens=len(spec.prompt_ids), send_time=time.perf_counter())
    parts = []
    try:
        async for piece in pieces:
            if piece:
                rec.chunk_times.append(time.perf_counter())
                parts.append(piece)
        rec.success = bool(rec.chunk_times)
        rec.error = "" if rec.success else "no content chunk in the stream"
    except Exception as exc:  # noqa: BLE001 - a failed request is data
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
    rec.text = "".join(parts)
    rec.output_tokens = len(rec.chunk_times) if rec.success else 0
    return rec


async def run_load_async(specs: Sequence[RequestSpec], *, base_url: str = "http://localhost", uds: str | None = None,
                         endpoint: str = "/v1/completions", rate: float = float("inf"), burstiness: float = 1.0,
                         concurrency: int | None = None, seed: int = 0, timeout_s: float = 60.0,
                         model: str = "kit-gpt", prompt_as: str = "ids",
                         extra_body: dict | None = None,
                         send: Callable[[RequestSpec], Awaitable[RequestRecord]] | None = None,
                         ) -> tuple[list[RequestRecord], float]:
    """Send `specs` with the arrival process and concurrency cap; returns (records in spec order, duration_s).
    duration_s runs from the first send to the last request's end. `uds` connects through a Unix socket;
    `send` replaces HTTP altogether (an in-process engine). A request running past timeout_s is recorded as
    failed ("timeout")."""
    if send is None:
        def send(spec):
            return send_completion(spec, base_url=base_url, uds=uds, endpoint=endpoint, model=model,
                                   prompt_as=prompt_as, extra_body=extra_body)
    offsets = arrival_offsets(len(specs), rate, burstiness, seed=seed)
    gate = asyncio.Semaphore(concurrency or len(specs) or 1)
    start = time.perf_counter()

    async def one(spec, offset):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            sent = time.perf_counter()
            try:
                return await asyncio.wait_for(send(spec), timeout_s)
            except asyncio.TimeoutError:
                return RequestRecord(len(spec.prompt_ids), sent, error=f"timeout after {timeout_s} s")

    records = await asyncio.gather(*(one(s, o) for s, o in zip(specs, offsets)))
    return list(records), time.perf_counter() - start


def run_load(specs: Sequence[RequestSpec], **kwargs) -> tuple[list[RequestRecord], float]:
    """run_load_async in a fresh event loop (for synchronous callers)."""
    return asyncio.run(run_load_async(specs, **kwargs))


# Raw records on disk: every percentile recomputable from the file alone --------------------------------------
RECORD_FIELDS = ("prompt_tokens", "send_time", "chunk_times", "output_tokens", "success", "error", "text")


def write_records(path, records: Sequence[RequestRecord], duration_s: float, **conditions) -> None:
    """Write a benchmark's raw per-request records as JSON: {"duration_s", "conditions" (what the run was: load,
    arrival process, limits...), "records": [one dict of RECORD_FIELDS per request, in send order]}."""
    data = {"duration_s": duration_s, "conditions": conditions,
            "records": [{k: getattr(r, k) for k in RECORD_FIELDS} for r in records]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


def read_records(path) -> tuple[list[RequestRecord], float, dict]:
    """(records, duration_s, conditions) of a file `write_records` wrote; ValueError naming what is wrong."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise ValueError('expected a JSON object with a "records" list')
    duration = data.get("duration_s")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not duration > 0:
        raise ValueError(f'"duration_s" must be a number > 0, got {duration!r}')
    records = []
    for i, raw in enumerate(data["records"]):
        if not isinstance(raw, dict) or set(raw) != set(RECORD_FIELDS):
            raise ValueError(f"record {i} must have exactly the fields {RECORD_FIELDS}")
        times = raw["chunk_times"]
        ok = (type(raw["prompt_tokens"]) is int and type(raw["output_tokens"]) is int
              and isinstance(raw["send_time"], (int, float)) and type(raw["success"]) is bool
              and isinstance(raw["error"], str) and isinstance(raw["text"], str) and isinstance(times, list)
              and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times))
        if not ok:
            raise ValueError(f"record {i} has a field of the wrong type: {raw!r:.300}")
        records.append(RequestRecord(**raw))
    conditions = data.get("conditions") or {}
    return records, float(duration), conditions if isinstance(conditions, dict) else {}


def serving_cost(metrics: dict, price_per_hour: float) -> dict:
    """Cost of a benchmark at `price_per_hour` (dollars per device hour), idle time counted: the device is paid
    for the whole wall time of the run (metrics["duration_s"]), not only while it computed. Returns
    {"run_usd", "usd_per_request" (per successful request), "usd_per_1k_requests", "usd_per_output_token",
    "usd_per_1m_output_tokens"}; a cost per nothing (no success, no token) is inf."""
    run = price_per_hour * metrics["duration_s"] / 3600.0
    per_request = run / metrics["completed"] if metrics["completed"] else math.inf
    per_token = run / metrics["total_output"] if metrics["total_output"] else math.inf
    return {"run_usd": run, "usd_per_request": per_request, "usd_per_1k_requests": per_request * 1000,
            "usd_per_output_token": per_token, "usd_per_1m_output_tokens": per_token * 1e6}
