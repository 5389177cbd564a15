"""Platform track (weeks 22-24): the learner's gateway (`gateway:app`, uvicorn in the sandbox on a Unix socket,
infracourse.grading.serving) supervises the course's model service (kit.platform_service) and keeps two request
classes apart under the class limits the judge sets (INFRACOURSE_CLASSES, kit.platform_service.class_limits).
The judge drives it through phases whose evidence the checks read; every time is the judge's clock:

  fifo       the course service alone (one FIFO, no learner code) under the judge's batch flood with light
             interactive traffic: the baseline the learner's raw/baseline.json must reproduce
  mixed      a batch flood far above what batch's quota serves (25/s for 4 s) and, 1 s in, light interactive
             traffic (3/s): interactive TTFT, batch refusals and how fast they came, and the service's own
             /debug/state sampled while only batch ran (how many sequences it ran at once)
  recovery   interactive requests (8/s), half of them meeting the service's drop fault; the judge SIGKILLs the
             service (not the gateway) and clocks when a new one answers /health; the service's journal says
             what was computed, and how often
  capacity   capacity.json's interactive rate run again at 0.9x and 1.15x beside a batch flood (12/s)
  starved    a second gateway whose batch quota the judge sets to 0 slots: batch must be refused at once,
             interactive served

What the gateway says about itself is not evidence: the judge reads the service's journal and /debug/state
(course code), its process tree, and its own load generator's records.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from infracourse.grader import LabCheckFailed, serving
from infracourse.kit import platform_service as ps
from track_platform_judging import (DROP_RATE, FIFO_BATCH, FIFO_INTERACTIVE, FIFO_LEAD_S, FIFO_RATE, LIMITS, NEEDS,
                                    Started, metrics_of, phase_capacity, phase_mixed, phase_of, phase_recovery,
                                    phase_starved, read_capacity, short_scratch, specs_of, start_failure, two_classes)


@pytest.fixture(scope="session")
def started(request, learner, device, seed, tmp_path_factory):
    s = seed % 10_000
    graded = {m.args[0] for item in request.session.items for m in item.iter_markers("check")}
    wanted = [name for name, checks in NEEDS.items() if checks & graded]
    base = ps.platform_config(device).to_env()
    journal = Path()
    plans = {}
    for name in wanted:
        scratch = short_scratch(tmp_path_factory, name)
        if name == "fifo":  # the course service alone: no learner code
            env = {**base, ps.PLATFORM_ENV: json.dumps({"seed": s})}
            plans[name] = (tmp_path_factory.mktemp("fifo-app"), "infracourse.kit.platform_service:app", scratch, env)
        elif name == "gateway":
            journal = scratch / "journal.jsonl"
            platform = {"journal": str(journal), "seed": s, "faults": {"drop_rate": DROP_RATE}}
            env = {**base, ps.PLATFORM_ENV: json.dumps(platform), ps.CLASSES_ENV: json.dumps(LIMITS)}
            plans[name] = (learner.root, "gateway:app", scratch, env)
        else:  # the judge sets batch's quota too low
            env = {**base, ps.PLATFORM_ENV: json.dumps({"seed": s}),
                   ps.CLASSES_ENV: json.dumps({**LIMITS, "batch_slots": 0})}
            plans[name] = (learner.root, "gateway:app", scratch, env)
    servers, failures = {}, {}
    for name, (root, app, scratch, env) in plans.items():
        servers[name] = serving.start(root, app, scratch=scratch, env=env, device=device)
    try:
        for name in list(servers):
            try:
                serving.wait_ready(servers[name], 90)
            except LabCheckFailed as exc:
                failures[name] = (f"the judge's FIFO baseline (the course service alone) did not start: {exc}"
                                  if name == "fifo" else start_failure(exc))
        yield Started(s, journal, servers, failures)
    finally:
        for server in servers.values():
            serving.stop(server)


# --- week 22: the FIFO baseline on the course service alone ----------------------------------------------------

@pytest.fixture(scope="session")
def fifo(started) -> serving.Phase:
    try:
        server = started.get("fifo")
        s = started.seed
        runs = asyncio.run(two_classes(server.uds, batch_specs=specs_of(FIFO_BATCH, s + 1), batch_rate=float("inf"),
                                       lead_s=FIFO_LEAD_S, interactive_specs=specs_of(FIFO_INTERACTIVE, s + 2),
                                       interactive_rate=FIFO_RATE, burstiness=20.0, seed=s))
    except Exception as exc:  # noqa: BLE001 - the course service alone: a course bug, not the learner's
        return serving.Phase(failure=f"the judge's FIFO baseline could not run ({type(exc).__name__}: {exc})")
    timed, start, end = runs["interactive"]
    return serving.Phase(data={"metrics": metrics_of(timed, start, end), "records": [t.record for t in timed]})


@pytest.fixture(scope="session")
def mixed(started) -> serving.Phase:
    return phase_of(started, "gateway", "mixed", phase_mixed, started.seed)


@pytest.fixture(scope="session")
def capacity(started, learner, mixed) -> serving.Phase:
    try:
        claimed = read_capacity(learner)
    except LabCheckFailed as exc:
        return serving.Phase(failure=str(exc))
    return phase_of(started, "gateway", "capacity", phase_capacity, started.seed, claimed)


@pytest.fixture(scope="session")
def recovery(started, mixed, capacity) -> serving.Phase:  # the kill comes after the measurements
    return phase_of(started, "gateway", "recovery", phase_recovery, started.seed, started.journal)


@pytest.fixture(scope="session")
def starved(started) -> serving.Phase:
    return phase_of(started, "starved", "starved", phase_starved, started.seed)
