"""The shared judging helpers of the week20 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass

from infracourse.grader import LabCheckFailed, serving
from infracourse.kit import service_kit as sk


LOAD_DELAY_S = 2.0
JUDGE_CFG = sk.ServiceConfig(load_delay_s=LOAD_DELAY_S)
# the learner's files (lab.yaml `files`): what another person gets, and all the clean-copy check copies
FILES = ("server.py", "limiter.py", "run.sh", "DEPLOY.md", "Dockerfile", "requirements.txt", "report.md")


@dataclass
class Served:
    seed: int
    cfg: sk.ServiceConfig
    phases: dict[str, serving.Phase]
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

def phase_readiness(server: serving.Server, seed: int, ledger: list) -> dict:
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


def phase_rate(server: serving.Server, seed: int, ledger: list) -> dict:
    data = sk.rate_phase(server.uds, seed)
    ledger.extend(data["baseline"] + data["steady"] + data["greedy"])
    return data


def phase_deadline(server: serving.Server, seed: int, ledger: list) -> dict:
    a = sk.deadline_phase(server.uds, seed)
    ledger.append(a)
    return {"answer": a}


def phase_burst(server: serving.Server, seed: int, ledger: list) -> dict:
    data = sk.burst_phase(server.uds, JUDGE_CFG, seed)
    ledger.extend(a for a in data["answers"] if a is not None)
    return data


def phase_final(server: serving.Server, seed: int, ledger: list) -> dict:
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
    return {"samples": samples}


def keep_phase(phases: dict, name: str, server: serving.Server, fn, *args) -> None:
    try:
        phases[name] = serving.Phase(data=fn(server, *args))
    except LabCheckFailed as exc:
        phases[name] = serving.Phase(failure=teach_from_log(server.log_tail(20000), str(exc)))
    except Exception as exc:  # noqa: BLE001 - a phase the server broke: its checks fail, the others still run
        alive = "" if server.alive() else " (your server has exited)"
        phases[name] = serving.Phase(failure=teach_from_log(
            server.log_tail(20000), f"the judge's {name} phase could not complete{alive}: {type(exc).__name__}: {exc}"))


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
