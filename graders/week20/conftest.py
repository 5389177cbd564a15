"""Week 20: the learner's service, started once per grade (infracourse.grading.serving: uvicorn in the sandbox,
on a Unix socket) with a model load the judge makes slow, and driven through phases whose evidence the checks
read (infracourse.kit.service_kit holds the probes; every time below is the judge's clock):

  readiness  from the start: /health and /ready polled while the model loads, then a completion
  rate       an under-limit client alone (its baseline), then again while two over-limit clients hammer
  deadline   a request whose deadline is far shorter than its generation
  burst      3 x (slots + queue) requests at once, /metrics' queue depth sampled meanwhile
  final      /metrics and the server's log after everything, held against every answer the judge got

What the service says about itself (/metrics, its log) is evidence, checked against what the judge saw.
"""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from infracourse.launch import output
from infracourse.grading.serving import Phase, Server, start, stop, wait_ready
from infracourse.guard import LabCheckFailed
from infracourse.kit import service_kit as sk

LOAD_DELAY_S = 2.0
JUDGE_CFG = sk.ServiceConfig(load_delay_s=LOAD_DELAY_S)
# the learner's files (lab.yaml `files`): what another person gets, and all the clean-copy check copies
FILES = ("server.py", "limiter.py", "run.sh", "DEPLOY.md", "Dockerfile", "requirements.txt", "report.md")


@dataclass
class Served:
    seed: int
    cfg: sk.ServiceConfig
    phases: dict[str, Phase]
    answers: list  # every completion the judge sent, in order
    log: str = ""

    @contextmanager
    def teaching(self):
        """A check's failure, plus what the server's log says went wrong (a NotImplementedError: not written)."""
        try:
            yield
        except LabCheckFailed as exc:
            message = str(exc)
            if "Your server raised" in message or "Your server's log ends" in message:
                raise
            raise LabCheckFailed(teach_from_log(self.log, message)) from None


def teach_from_log(log: str, what: str) -> str:
    """`what`, plus the NotImplementedErrors (each once) or the last error line of the server's log."""
    todo = list(dict.fromkeys(x.strip() for x in log.splitlines() if x.startswith("NotImplementedError")))
    if todo:
        return f"{what}. Your server raised {'; '.join(todo[-3:])}: not written yet (see the handout)"
    errors = re.findall(r"^\w*(?:Error|Exception)\b.*$", log, re.MULTILINE)
    return f"{what}. Your server's log ends with: {errors[-1]}" if errors else what


def _ok(answer: sk.Answer, what: str) -> None:
    if not answer.status:
        raise LabCheckFailed(f"{what}: no answer from your server ({answer.error})")


# --- the phases ------------------------------------------------------------------------------------------------

def phase_readiness(server: Server, seed: int, ledger: list) -> dict:
    target, began = server.uds, server.began
    health = sk.call(target, "GET", "/health")
    polls = []  # (seconds since launch, /ready status)
    while True:
        a = sk.call(target, "GET", "/ready", timeout_s=5)
        polls.append((a.answered - began, a.status))
        if a.status != 503 or a.answered - began > 60:  # ready, or an answer that is no readiness at all
            break
        server.require_alive("while its model loaded")
        if a.status == 0:
            raise LabCheckFailed(f"GET /ready got no answer while the model loaded ({a.error})")
        time.sleep(0.02)
    after = [sk.call(target, "GET", "/ready").status for _ in range(3)]
    prompt = sk.prompts(1, seed + 3)[0]
    done = sk.complete(target, prompt, 8, client="readiness", phase="readiness")
    ledger.append(done)
    return {"health": health.status, "health_s": health.answered - began, "polls": polls, "after": after,
            "completion": done, "prompt": prompt}


def phase_rate(server: Server, seed: int, ledger: list) -> dict:
    data = sk.rate_phase(server.uds, seed)
    ledger.extend(data["baseline"] + data["steady"] + data["greedy"])
    return data


def phase_deadline(server: Server, seed: int, ledger: list) -> dict:
    a = sk.deadline_phase(server.uds, seed)
    ledger.append(a)
    return {"answer": a}


def phase_burst(server: Server, seed: int, ledger: list) -> dict:
    data = sk.burst_phase(server.uds, JUDGE_CFG, seed)
    ledger.extend(a for a in data["answers"] if a is not None)
    return data


def phase_final(server: Server, seed: int, ledger: list) -> dict:
    time.sleep(0.2)  # the deadline request's thread and the last log lines settle
    a = sk.call(server.uds, "GET", "/metrics")
    _ok(a, "GET /metrics after the load")
    if a.status != 200:
        raise LabCheckFailed(f"GET /metrics answered HTTP {a.status}: {a.body[:200]!r}")
    text = a.body.decode("utf-8", "replace")
    try:
        samples = sk.parse_metrics(text)
    except ValueError as exc:
        raise LabCheckFailed(f"GET /metrics is not the Prometheus text format: {exc}") from None
    return {"samples": samples, "text": text}


def _run(phases: dict, name: str, server: Server, fn, *args) -> None:
    try:
        phases[name] = Phase(data=fn(server, *args))
    except LabCheckFailed as exc:
        phases[name] = Phase(failure=teach_from_log(server.log_tail(20000), str(exc)))
    except Exception as exc:  # noqa: BLE001 - a phase the server broke: its checks fail, the others still run
        alive = "" if server.alive() else " (your server has exited)"
        phases[name] = Phase(failure=teach_from_log(server.log_tail(20000), f"the judge's {name} phase could not "
                                                    f"complete{alive}: {type(exc).__name__}: {exc}"))


@pytest.fixture(scope="session")
def served(learner, seed, tmp_path_factory) -> Served:
    s = seed % 10_000
    phases: dict[str, Phase] = {}
    ledger: list = []
    began = time.perf_counter()
    server = start(learner.root, "server:app", scratch=tmp_path_factory.mktemp("srv"), env=JUDGE_CFG.to_env())
    server.began = began  # the launch, on the judge's clock
    try:
        try:
            wait_ready(server, 60)
        except LabCheckFailed as exc:
            failure = teach_from_log(server.log_tail(20000), str(exc))
            for name in ("readiness", "rate", "deadline", "burst", "final"):
                phases[name] = Phase(failure=failure)
            return Served(s, JUDGE_CFG, phases, ledger, server.log_tail(200000))
        _run(phases, "readiness", server, phase_readiness, s, ledger)
        polls = phases["readiness"].data.get("polls") or [(0.0, 200)]
        if phases["readiness"].failure or polls[0][1] == 200:
            # /ready may be what is wrong: wait for the model anyway (the other phases need it), within reason;
            # the load began about when the server first answered
            loaded_by = began + server.started_s + LOAD_DELAY_S + 3.0
            time.sleep(max(0.0, loaded_by - time.perf_counter()))
            deadline = began + LOAD_DELAY_S + 10
            while time.perf_counter() < deadline and server.alive():
                if sk.call(server.uds, "GET", "/ready", timeout_s=2).status == 200:
                    break
                time.sleep(0.1)
        _run(phases, "rate", server, phase_rate, s, ledger)
        _run(phases, "deadline", server, phase_deadline, s, ledger)
        _run(phases, "burst", server, phase_burst, s, ledger)
        _run(phases, "final", server, phase_final, s, ledger)
        # the whole log is evidence (test_observability), read up to the output cap: the server may write the file
        return Served(s, JUDGE_CFG, phases, ledger, output.read_tail(server.log_path, output.OUTPUT_LIMIT))
    finally:
        stop(server)


@pytest.fixture(scope="session")
def judge_model():
    from infracourse.kit.threads import intra_op_threads

    model = sk.ServiceModel(sk.ServiceConfig(seed=JUDGE_CFG.seed, token_ms=0.0))
    with intra_op_threads(1):
        model.load()
        yield model


def expect_tokens(judge_model, answer: sk.Answer, prompt: list[int], max_tokens: int, what: str) -> None:
    """A 200 whose JSON holds `tokens`: the course model's greedy tokens for `prompt`."""
    body = answer.json()
    if answer.status != 200 or not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
        raise LabCheckFailed(f"{what}: expected HTTP 200 with a JSON body holding `tokens` (the list "
                             f"model.generate returned), got HTTP {answer.status} {answer.body[:200]!r}")
    expected = judge_model.generate(prompt, max_tokens)
    if body["tokens"] != expected:
        raise LabCheckFailed(f"{what}: tokens {body['tokens']} are not the course model's greedy tokens {expected} "
                             f"for prompt {prompt}: answer with what model.generate(prompt, max_tokens) returns")
