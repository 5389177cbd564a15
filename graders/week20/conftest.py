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

import time

import pytest

from infracourse.grader import LabCheckFailed, output, serving
from infracourse.kit import service_kit as sk
from week20_judging import (JUDGE_CFG, LOAD_DELAY_S, Served, keep_phase, phase_burst, phase_deadline, phase_final,
                            phase_rate, phase_readiness, teach_from_log)


@pytest.fixture(scope="session")
def served(learner, seed, tmp_path_factory) -> Served:
    s = seed % 10_000
    phases: dict[str, serving.Phase] = {}
    ledger: list = []
    began = time.perf_counter()
    server = serving.start(learner.root, "server:app", scratch=tmp_path_factory.mktemp("srv"), env=JUDGE_CFG.to_env())
    server.began = began  # the launch, on the judge's clock
    try:
        try:
            serving.wait_ready(server, 60)
        except LabCheckFailed as exc:
            failure = teach_from_log(server.log_tail(20000), str(exc))
            for name in ("readiness", "rate", "deadline", "burst", "final"):
                phases[name] = serving.Phase(failure=failure)
            return Served(s, JUDGE_CFG, phases, ledger, server.log_tail(200000))
        keep_phase(phases, "readiness", server, phase_readiness, s, ledger)
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
        keep_phase(phases, "rate", server, phase_rate, s, ledger)
        keep_phase(phases, "deadline", server, phase_deadline, s, ledger)
        keep_phase(phases, "burst", server, phase_burst, s, ledger)
        keep_phase(phases, "final", server, phase_final, s, ledger)
        # the whole log is evidence (test_observability), read up to the output cap: the server may write the file
        return Served(s, JUDGE_CFG, phases, ledger, output.read_tail(server.log_path, output.OUTPUT_LIMIT))
    finally:
        serving.stop(server)


@pytest.fixture(scope="session")
def judge_model():
    from infracourse.kit.threads import intra_op_threads

    model = sk.ServiceModel(sk.ServiceConfig(seed=JUDGE_CFG.seed, token_ms=0.0))
    with intra_op_threads(1):
        model.load()
        yield model
