"""The engine behind its HTTP server (server.py under uvicorn, in the sandbox, on a Unix socket: the course's
grading.serving), driven by the course's load generator (kit.loadgen).

served-overload  Poisson arrivals at OVERLOAD x the capacity (one request at a time, MAX_TOKENS steps of at least
                 STEP_S each): some requests are refused with HTTP 429 (or 503) and nothing fails otherwise;
                 probes sent while the queue is full are refused within REFUSE_S (or 5 per-token times on a loaded
                 machine) on the judge's clock; every
                 admitted request streams the model's greedy tokens, and their P99 E2EL stays within
                 (max_queue + 1) x MAX_TOKENS x the measured per-token time x 1.5 + 0.3 s; the deepest queue the
                 server saw is at most max_queue; every block is free afterwards.
served-cancel    a client that hangs up after 3 tokens of a 40-token stream: within 2 s /stats shows one more
                 request cancelled and every block free.
"""
import json
import random
import statistics
import threading
import time

import numpy as np
import pytest
import torch

from infracourse.grader import serving
from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.loadgen import RequestSpec
from week18_judging import require

SERVE_CFG = GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_head=2, n_layer=2)  # server.py's
STEP_S, MAX_TOKENS, MAX_QUEUE, NUM_BLOCKS = 0.01, 6, 4, 48
OVERLOAD, ARRIVALS, REFUSE_S = 3.0, 60, 0.25
REFUSED = ("HTTP 429", "HTTP 503")


@pytest.fixture(scope="module")
def server(learner, tmp_path_factory, seed):
    env = {"INFRACOURSE_SERVE": json.dumps({"max_queue": MAX_QUEUE, "step_s": STEP_S, "num_blocks": NUM_BLOCKS,
                                            "block_size": 4, "seed": seed % 1000})}
    with serving.serve(learner.root, "server:app", scratch=tmp_path_factory.mktemp("srv"), env=env,
                       ready_timeout_s=60) as running:
        yield running


def greedy_tokens(model, prompt, n):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, len(prompt):].tolist()


def settle(server, condition, timeout_s=2.0):
    """/stats, polled until condition(stats) holds or timeout_s passed: the last answer."""
    end = time.perf_counter() + timeout_s
    while True:
        stats = server.get_json("/stats")
        if condition(stats) or time.perf_counter() > end:
            return stats
        time.sleep(0.05)


@pytest.mark.check("served-overload")
def test_served_overload(server, record, seed):
    r = random.Random(seed)
    model = GPT(SERVE_CFG, seed=seed % 1000).eval()
    specs = [RequestSpec([r.randrange(256) for _ in range(r.randint(3, 8))], MAX_TOKENS) for _ in range(ARRIVALS)]
    rate = OVERLOAD / (MAX_TOKENS * STEP_S)
    what = (f"seed {seed}: {ARRIVALS} Poisson arrivals at {rate:.0f}/s ({OVERLOAD:g}x the capacity of one request "
            f"at a time, {MAX_TOKENS} steps of >= {STEP_S * 1e3:g} ms), max_queue {MAX_QUEUE}")
    probes = []

    def probe():  # while the load runs: requests whose answer the judge times itself
        time.sleep(0.4)
        for _ in range(4):
            stream = None
            t0 = time.perf_counter()
            try:
                stream = server.stream({"prompt": [1, 2, 3], "max_tokens": MAX_TOKENS, "stream": True})
                probes.append((stream.status, time.perf_counter() - t0))
            except OSError as exc:
                probes.append((f"{type(exc).__name__}", time.perf_counter() - t0))
            finally:
                if stream is not None:
                    stream.close()  # an admitted probe is a client going away
            time.sleep(0.15)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    records, duration = server.load(specs, rate=rate, seed=seed, timeout_s=30)
    prober.join()
    server.require_alive("during the overload")
    refused = [x for x in records if not x.success and x.error.startswith(REFUSED)]
    other = [x for x in records if not x.success and not x.error.startswith(REFUSED)]
    admitted = [(s, x) for s, x in zip(specs, records) if x.success]
    require(not other, f"{what}: {len(other)} request(s) failed other than by a refusal, e.g. {other[0].error[:300]!r}"
            if other else "")
    require(refused, f"{what}: all {ARRIVALS} were admitted: at {OVERLOAD:g}x the capacity a bounded queue must "
            "refuse (engine.submit returns None, the server answers 429)")
    for spec, rec in admitted:
        got = [ord(c) for c in rec.text]
        require(got == greedy_tokens(model, spec.prompt_ids, MAX_TOKENS),
                f"{what}: an admitted request's tokens {got} are not the model's greedy tokens for its prompt")
    itl = statistics.median(g for _, x in admitted for g in x.itl)
    bound = (MAX_QUEUE + 1) * MAX_TOKENS * itl * 1.5 + 0.3
    e2el = [x.e2el for _, x in admitted]
    p50, p95, p99 = (float(v) for v in np.percentile(e2el, [50, 95, 99]))
    refuse_limit = max(REFUSE_S, 5 * itl)  # a loaded machine slows every answer, the steps included
    slow_refusals = [t for status, t in probes if status in (429, 503) and t > refuse_limit]
    stats = settle(server, lambda s: s.get("free_blocks") == s.get("num_blocks"))
    record("admitted E2EL P50", p50 * 1e3, unit="ms", seconds=p50)
    record("admitted E2EL P95", p95 * 1e3, unit="ms", seconds=p95)
    record("admitted E2EL P99", p99 * 1e3, target=bound * 1e3, unit="ms", seconds=p99)
    record("TTFT P99", float(np.percentile([x.ttft for _, x in admitted], 99)) * 1e3, unit="ms")
    record("per-token latency (ITL median)", itl * 1e3, unit="ms", seconds=itl)
    record("refused fraction", len(refused) / ARRIVALS, unit="fraction")
    record("goodput", sum(e <= bound for e in e2el) / duration, unit="req/s")
    record("output tokens per second", sum(x.output_tokens for _, x in admitted) / duration, unit="tok/s")
    require(p99 <= bound, f"{what}: admitted requests' P99 E2EL is {p99 * 1e3:.0f} ms (P50 {p50 * 1e3:.0f}); with at "
            f"most {MAX_QUEUE} waiting ahead, each {MAX_TOKENS} tokens of {itl * 1e3:.1f} ms, it must stay within "
            f"{bound * 1e3:.0f} ms: refuse new requests when max_queue wait")
    require(not slow_refusals, f"{what}: a refusal took {max(slow_refusals, default=0) * 1e3:.0f} ms on the judge's "
            f"clock (limit {refuse_limit * 1e3:.0f} ms): refuse at once, before any work; probes (status, s): {probes}")
    require(type(stats.get("deepest_queue")) is int and stats["deepest_queue"] <= MAX_QUEUE,
            f"{what}: /stats says the queue held up to {stats.get('deepest_queue')!r} requests; the bound is {MAX_QUEUE}")
    require(stats.get("free_blocks") == stats.get("num_blocks") == NUM_BLOCKS,
            f"{what}: after the load /stats shows {stats.get('free_blocks')} of {stats.get('num_blocks')} blocks free "
            "(each probe that was admitted hung up: cancel must free its blocks)")


@pytest.mark.check("served-cancel")
def test_served_cancel(server, seed):
    before = settle(server, lambda s: s.get("queue_depth") == 0 and s.get("free_blocks") == s.get("num_blocks"))
    what = "a 40-token stream whose client hangs up after 3 tokens"
    stream = server.stream({"prompt": [5, 6, 7], "max_tokens": 40, "stream": True})
    require(stream.status == 200, f"{what}: the request was answered HTTP {stream.status} with the server idle")
    got = 0
    for _, event in stream.events():
        got += isinstance(event, dict) and bool(event.get("choices"))
        if got == 3:
            break
    stream.close()
    cancelled = before.get("statuses", {}).get("cancelled", 0)
    after = settle(server, lambda s: s.get("statuses", {}).get("cancelled", 0) > cancelled
                   and s.get("free_blocks") == s.get("num_blocks"))
    require(after.get("statuses", {}).get("cancelled", 0) > cancelled and after.get("free_blocks") == NUM_BLOCKS,
            f"{what}: 2 s later /stats shows {after.get('free_blocks')} of {NUM_BLOCKS} blocks free and statuses "
            f"{after.get('statuses')} (cancelled before: {cancelled}): the server cancels a request whose client "
            "went away (engine.cancel), which must free its slot and blocks")
