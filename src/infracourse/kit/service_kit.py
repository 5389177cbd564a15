"""Week 20's course code: the model the learner's service wraps, the fake clock its limiter is tested with, and
the judge's probes of a running service (also the learner's own test load: `python -m infracourse.kit.service_kit`).

    cfg = ServiceConfig.from_env()        # the judge's settings (INFRACOURSE_SERVICE, JSON); defaults below
    model = ServiceModel(cfg)
    model.load()                          # blocking: builds the kit GPT, lasting at least cfg.load_delay_s
    model.loaded                          # True once load() has returned
    ids = model.generate([72, 105], 8, cancel=event)   # greedy tokens; each lasts at least cfg.token_ms (a
                                          # device's step); stops early, returning what it has, once `event` is set
    model.text(ids)                       # the tokens as text (128 ASCII characters, one per token)

    clock = FakeClock(); clock(); clock.advance(0.25)  # a clock the test moves by hand (time.monotonic's shape)

The probes (`rate_phase`, `deadline_phase`, `burst_phase`) speak plain HTTP/1.1 to a Unix socket or to
`host:port`, on the caller's clock (`time.perf_counter`); every answer is an `Answer` (status, headers, body,
sent and answered times). `parse_metrics` reads the Prometheus text exposition format; `json_lines` the
structured log lines of a log.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar

from infracourse.kit.env_config import EnvConfig
from infracourse.kit.loadgen import UnixHTTPConnection

ENV = "INFRACOURSE_SERVICE"
CLIENT_HEADER = "X-Client-Id"
REQUEST_ID_HEADER = "X-Request-Id"
OUTCOME_OF_STATUS = {200: "ok", 429: "rate_limited", 503: "rejected", 504: "timeout"}


@dataclass(frozen=True)
class ServiceConfig(EnvConfig):
    """The service's limits, set by whoever starts it (the judge, your run.sh) through the INFRACOURSE_SERVICE
    environment variable, a JSON object of these fields; absent fields keep these defaults."""
    env_var: ClassVar[str] = ENV
    seed: int = 0                  # the model's weights
    load_delay_s: float = 0.0      # the least time ServiceModel.load() takes (a large model's load)
    token_ms: float = 20.0         # the least time one generated token takes (a device's decode step)
    rate: float = 5.0              # requests per second each client may sustain (token bucket refill)
    burst: int = 3                 # requests a client may send at once (token bucket capacity)
    max_concurrency: int = 2       # requests generating at once
    max_queue: int = 6             # requests waiting for a generation slot; one more is refused (503)
    request_timeout_s: float = 10.0  # a request's deadline when its body names no timeout_s


class ServiceModel:
    """The kit's tiny GPT (kit.batching's serving shape, seeded) behind a blocking, cancellable generate."""

    def __init__(self, cfg: ServiceConfig | None = None):
        self.cfg = cfg or ServiceConfig()
        self.model = None
        self._loaded = threading.Event()

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    def load(self) -> None:
        """Build the model; lasts at least cfg.load_delay_s. Call it once (a second call does nothing)."""
        if self.loaded:
            return
        started = time.monotonic()
        # why: torch and the model load inside load(), the start-up this service reports, not at import
        from infracourse.kit.batching import ServeConfig, serve_model

        model = serve_model(ServeConfig(seed=self.cfg.seed))
        rest = self.cfg.load_delay_s - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)
        self.model = model
        self._loaded.set()

    def generate(self, prompt_ids, max_tokens: int, cancel: threading.Event | None = None) -> list[int]:
        """Greedy tokens after `prompt_ids` (ints 0..127, or a str), up to max_tokens; each token lasts at least
        cfg.token_ms. Returns early with the tokens so far when `cancel` is set. ValueError for a bad request,
        RuntimeError before load()."""
        import torch

        if not self.loaded:
            raise RuntimeError("ServiceModel.generate before load() finished: the model is not loaded yet")
        ids = [ord(c) for c in prompt_ids] if isinstance(prompt_ids, str) else list(prompt_ids)
        if not ids or any(not isinstance(t, int) or not 0 <= t < 128 for t in ids):
            raise ValueError("prompt must be a non-empty string of ASCII characters or a list of ids 0..127")
        if not isinstance(max_tokens, int) or max_tokens < 1 or len(ids) + max_tokens > self.model.cfg.seq_len:
            raise ValueError(f"max_tokens must be >= 1 and prompt + max_tokens <= {self.model.cfg.seq_len}")
        floor = self.cfg.token_ms / 1000.0
        out: list[int] = []
        seq = torch.tensor(ids)
        with torch.no_grad():
            for _ in range(max_tokens):
                if cancel is not None and cancel.is_set():
                    break
                started = time.monotonic()
                nxt = self.model(seq[None])[0, -1].float().argmax()
                seq = torch.cat([seq, nxt[None]])
                out.append(int(nxt))
                rest = floor - (time.monotonic() - started)
                if rest > 0:
                    if cancel is not None:
                        cancel.wait(rest)
                    else:
                        time.sleep(rest)
        return out

    @staticmethod
    def text(ids: list[int]) -> str:
        return "".join(chr(t) for t in ids)


class FakeClock:
    """A clock the test moves by hand: calling it returns the time (seconds, like time.monotonic)."""

    def __init__(self, start: float = 1000.0):
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += seconds


def probe_bucket(bucket_cls, rate: float, burst: int, script: list) -> list[dict]:
    """Runs in the grading worker: `bucket_cls(rate, burst, clock=FakeClock())`, then for each step
    (advance_s, attempts) of `script` moves the clock, calls allow() `attempts` times, and after a refusal
    reads retry_after(); a step (0, attempts, "retry") first waits the retry_after the last refusal named
    (plus 1 ns). Returns one dict per step: t (seconds since the start), admitted, retry_after
    (after the step's last refusal, or None)."""
    clock = FakeClock()
    bucket = bucket_cls(rate, burst, clock=clock)
    out, last_retry = [], None
    start = clock()
    for step in script:
        advance, attempts = step[0], step[1]
        if len(step) > 2 and step[2] == "retry":
            advance = float(last_retry or 0.0) + 1e-9  # just after the time it named (float rounding aside)
        clock.advance(advance)
        admitted, retry = 0, None
        for _ in range(attempts):
            ok = bucket.allow()
            if not isinstance(ok, bool):
                raise TypeError(f"allow() must return a bool, it returned {ok!r}")
            if ok:
                admitted += 1
            else:
                retry = float(bucket.retry_after())
        if retry is not None:
            last_retry = retry
        out.append({"t": clock() - start, "admitted": admitted, "retry_after": retry})
    return out


# --- talking to a service -----------------------------------------------------------------------------------

@dataclass
class Answer:
    """One request on the caller's clock. status 0: no answer (error says why)."""
    path: str
    client: str
    status: int = 0
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    sent: float = 0.0
    answered: float = 0.0
    error: str = ""
    phase: str = ""

    @property
    def latency(self) -> float:
        return self.answered - self.sent

    @property
    def outcome(self) -> str:
        """The metrics' outcome label this answer must be counted under (a 503 before readiness: not_ready)."""
        if self.status == 503 and self.phase == "readiness":
            return "not_ready"
        return OUTCOME_OF_STATUS.get(self.status, "error")

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def call(target: str, method: str, path: str, body: dict | None = None, *, client: str = "",
         timeout_s: float = 15.0, phase: str = "") -> Answer:
    """One request to `target` (a Unix socket path, or host:port); never raises for the server's faults."""
    if target.startswith("/"):
        conn = UnixHTTPConnection(target, timeout_s)
    else:
        host, _, port = target.rpartition(":")
        conn = http.client.HTTPConnection(host or "127.0.0.1", int(port), timeout=timeout_s)
    headers = {"Connection": "close"}
    if client:
        headers[CLIENT_HEADER] = client
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    answer = Answer(path, client, phase=phase)
    try:
        conn.connect()
        answer.sent = time.perf_counter()
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        answer.body = resp.read()
        answer.status = resp.status
        answer.headers = {k.lower(): v for k, v in resp.getheaders()}
    except (OSError, http.client.HTTPException) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
    finally:
        answer.answered = time.perf_counter()
        if not answer.sent:
            answer.sent = answer.answered
        conn.close()
    return answer


def completion_body(prompt: list[int], max_tokens: int, timeout_s: float | None = None) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    return body


def complete(target: str, prompt, max_tokens: int, *, client: str, timeout_s: float | None = None,
             phase: str = "") -> Answer:
    return call(target, "POST", "/v1/completions", completion_body(prompt, max_tokens, timeout_s), client=client,
                phase=phase)


def prompts(n: int, seed: int, length: int = 8) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(32, 127) for _ in range(length)] for _ in range(n)]


def p99(values: list[float]) -> float:
    """np.percentile(values, 99), linear interpolation, without numpy."""
    v = sorted(values)
    if not v:
        return 0.0
    k = (len(v) - 1) * 0.99
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


# --- the probes (the judge's phases; the learner's test load) ------------------------------------------------

STEADY_N, STEADY_HZ = 8, 4.0          # the under-limit client: 8 requests, 4 per second (the rate is 5)
GREEDY_CLIENTS, GREEDY_HZ = 2, 20.0   # over-limit clients: each sends 20 per second, open loop
GREEDY_S = 2.4                        # for this long
PROBE_TOKENS = 2                      # new tokens per request in the rate phase
DEADLINE_TOKENS, DEADLINE_S = 100, 0.4   # a request whose generation (100 x 20 ms) outlasts its deadline
BURST_TOKENS = 12                     # the burst's requests: 12 new tokens each (about 0.25 s of work)


def _steady(target: str, seed: int, phase: str, delay_s: float = 0.0) -> list[Answer]:
    out = []
    ps = prompts(STEADY_N, seed)
    start = time.perf_counter() + delay_s
    for i, p in enumerate(ps):
        wait = start + i / STEADY_HZ - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        out.append(complete(target, p, PROBE_TOKENS, client="steady", phase=phase))
    return out


def _greedy(target: str, name: str, seed: int, out: list) -> None:
    n = int(GREEDY_S * GREEDY_HZ)
    ps = prompts(n, seed)
    start = time.perf_counter()
    for i, p in enumerate(ps):
        wait = start + i / GREEDY_HZ - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        out.append(complete(target, p, PROBE_TOKENS, client=name, phase="rate"))


def rate_phase(target: str, seed: int = 0) -> dict:
    """The under-limit client alone (its baseline), then again while over-limit clients hammer the service.
    {"baseline": [Answer], "steady": [Answer], "greedy": [Answer]}."""
    baseline = _steady(target, seed, "baseline")
    greedy: list[Answer] = []
    threads = [threading.Thread(target=_greedy, args=(target, f"greedy-{k}", seed + 1 + k, greedy), daemon=True)
               for k in range(GREEDY_CLIENTS)]
    for t in threads:
        t.start()
    steady = _steady(target, seed + 100, "rate", delay_s=0.3)  # after the greedy clients' first bursts
    for t in threads:
        t.join(60)
    return {"baseline": baseline, "steady": steady, "greedy": greedy}


def deadline_phase(target: str, seed: int = 0) -> Answer:
    """One request whose generation takes about 2 s, with a deadline of 0.4 s."""
    return complete(target, prompts(1, seed)[0], DEADLINE_TOKENS, client="deadline", timeout_s=DEADLINE_S,
                    phase="deadline")


def burst_phase(target: str, cfg: ServiceConfig, seed: int = 0) -> dict:
    """3 x (max_concurrency + max_queue) requests at once from as many clients, /metrics' queue depth sampled
    meanwhile. {"answers": [Answer], "depths": [float], "n": int}."""
    n = 3 * (cfg.max_concurrency + cfg.max_queue)
    answers: list = [None] * n
    go = threading.Event()
    ps = prompts(n, seed + 7)

    def one(i):
        go.wait()
        answers[i] = complete(target, ps[i], BURST_TOKENS, client=f"burst-{i}", phase="burst")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    depths: list[float] = []
    go.set()
    began = time.perf_counter()
    while any(t.is_alive() for t in threads) and time.perf_counter() - began < 60:
        a = call(target, "GET", "/metrics", timeout_s=5)
        if a.status == 200:
            value = parse_metrics(a.body.decode("utf-8", "replace")).get(("service_queue_depth", ()))
            if value is not None:
                depths.append(value)
        time.sleep(0.02)
    for t in threads:
        t.join(5)
    return {"answers": answers, "depths": depths, "n": n}


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


# --- reading what the service says ---------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text: str) -> dict[tuple, float]:
    """The Prometheus text format's samples: {(name, ((label, value), ...) sorted): float}. Comments and
    blank lines are skipped; a line that is not a sample raises ValueError naming it."""
    samples: dict[tuple, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"not a Prometheus sample line: {line[:120]!r}")
        name, labels_text, value = m.group(1), m.group(3) or "", m.group(4)
        labels, pos = [], 0
        while pos < len(labels_text):
            lm = _LABEL.match(labels_text, pos)
            if not lm:
                if labels_text[pos:].strip(" ,"):
                    raise ValueError(f"labels not name=\"value\" pairs in {line[:120]!r}")
                break
            labels.append((lm.group(1), bytes(lm.group(2), "utf-8").decode("unicode_escape")))
            pos = lm.end()
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"sample value {value!r} is not a number in {line[:120]!r}") from None
        samples[(name, tuple(sorted(labels)))] = number
    return samples


def json_lines(text: str) -> list[dict]:
    """Every line of `text` that is one JSON object."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def summary(rate: dict, deadline: Answer, burst: dict) -> dict:
    """The figures a report states, from the three phases."""
    ok = lambda xs: [a.latency for a in xs if a.status == 200]  # noqa: E731
    return {
        "steady_baseline_p99_ms": p99(ok(rate["baseline"])) * 1000,
        "steady_loaded_p99_ms": p99(ok(rate["steady"])) * 1000,
        "rate_limited_429s": sum(a.status == 429 for a in rate["greedy"]),
        "deadline_answer_ms": deadline.latency * 1000,
        "burst_rejected_503s": sum(a is not None and a.status == 503 for a in burst["answers"]),
        "burst_max_queue_depth": max(burst["depths"], default=0.0),
    }


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Week 20's test load against your running service: the rate, "
                                     "deadline and burst phases the grader runs; prints the report's figures.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--uds", help="the service's Unix socket")
    where.add_argument("--address", help="host:port, e.g. 127.0.0.1:8000")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # a socket path as given on the command line, relative to here: `call` tells a path by its leading "/"
    target = os.path.abspath(args.uds) if args.uds else args.address
    cfg = ServiceConfig.from_env()
    # one completion first, untimed: the grader's phases run after its readiness check has sent one, so its
    # baseline is a warm model's; a P99 of a few requests is otherwise the cold first forward's time
    complete(target, prompts(1, args.seed + 1)[0], 1, client="warm-up", phase="warm-up")
    rate = rate_phase(target, args.seed)
    deadline = deadline_phase(target, args.seed)
    burst = burst_phase(target, cfg, args.seed)
    metrics = call(target, "GET", "/metrics")
    print("```yaml figures")
    figures = {**summary(rate, deadline, burst), "rate_per_s": cfg.rate, "burst": cfg.burst,
               "max_queue": cfg.max_queue, "max_concurrency": cfg.max_concurrency}
    for k, v in figures.items():
        print(f"{k}: {v:.6g}")
    print("```")
    print("\n/metrics after the load:\n" + metrics.body.decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
