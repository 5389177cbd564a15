"""Week 21: the learner's gateway (`gateway:app`, uvicorn in the sandbox on a Unix socket, started once per
grade by infracourse.grading.serving) supervises the course's model service (kit.platform_service) and is driven
by the judge through phases whose evidence the checks read:

  recovery   a stream of requests, half of them with prompts the service's drop fault touches (their work is
             done and journaled, their answer lost); under it the judge SIGKILLs the service process (not the
             gateway) and clocks, on its own clock, the time until a new service process answers /health
  capacity   the learner's claimed capacity (capacity.json, written by sweep.py) run again by the judge at 0.9x
             and at 1.15x that rate with the course's capacity workload
  deploy     POST /admin/deploy {"version": "v2"} under light load, then the same with "v3": each is bad (the
             judge's faults: v2 answers errors, v3 steps 3x slower); the judge samples the process tree meanwhile,
             then asks which version answers

What the gateway says about itself is not evidence: the judge reads the service's execution journal (course
code, kit.platform_service), the process tree (psutil: each service process's version from its environment),
the version stamped in the chunks the service streams, and its own load generator's records.
"""
from __future__ import annotations

import json
import random
import re

import pytest

from infracourse.grader import LabCheckFailed, serving
from infracourse.kit import batching, platform_service as ps
from infracourse.kit.threads import intra_op_threads
from week21_judging import (BAD_VERSIONS, DIAG_FAULTS, DROP_RATE, Graded, Scenario, keep_phase, phase_capacity,
                            phase_classes, phase_deploys, phase_recovery, read_capacity, run_scenario, short_scratch)


# the checks that read each phase: a partial grade runs only the phases its checks read (graded_checks)
PHASE_CHECKS = {"recovery": {"supervisor-restarts", "no-request-lost", "executed-once"},
                "capacity": {"capacity-reproduced"}, "classes": {"class-isolation"}, "deploy": {"rollback"}}


@pytest.fixture(scope="session")
def graded(learner, device, seed, tmp_path_factory, graded_checks) -> Graded:
    s = seed % 10_000
    wanted = {name for name, readers in PHASE_CHECKS.items() if readers & graded_checks}
    scratch = short_scratch(tmp_path_factory, "gw")
    journal = scratch / "journal.jsonl"
    platform = {"journal": str(journal), "seed": s, "faults": {"drop_rate": DROP_RATE}, "versions": BAD_VERSIONS}
    env = {**ps.platform_config(device).to_env(), ps.PLATFORM_ENV: json.dumps(platform)}
    phases: dict[str, serving.Phase] = {}
    try:
        with serving.serve(learner.root, "gateway:app", scratch=scratch, env=env, ready_timeout_s=90,
                           device=device) as server:
            if "recovery" in wanted:
                keep_phase(phases, "recovery", server, phase_recovery, s, journal)
            gone = next((k for k in (phases.get("recovery", serving.Phase()).data or {}).get("kills", ())
                         if "new" not in k), None)
            if gone is not None:  # nothing serves: the other phases would only wait out their timeouts
                failure = (f"the judge's phase could not run: no course service answered after the judge killed pid "
                           f"{gone['victim']['pid']} (supervisor-restarts says why)")
                for name in ("capacity", "classes", "deploy"):
                    phases[name] = serving.Phase(failure=failure)
                return Graded(device, phases)
            if "capacity" in wanted:
                try:
                    claimed = read_capacity(learner)
                except LabCheckFailed as exc:
                    phases["capacity"] = serving.Phase(failure=str(exc))
                else:
                    keep_phase(phases, "capacity", server, phase_capacity, s, claimed)
            if "classes" in wanted:
                keep_phase(phases, "classes", server, phase_classes, s)
            if "deploy" in wanted:
                keep_phase(phases, "deploy", server, phase_deploys, s)
    except LabCheckFailed as exc:
        message = str(exc)
        todo = list(dict.fromkeys(re.findall(r"^NotImplementedError: .*$", message, re.MULTILINE)))
        if todo:
            message = (f"your gateway did not start: it raised {'; '.join(todo[-3:])}: not written yet (see the "
                       "handout)")
        for name in ("recovery", "capacity", "classes", "deploy"):
            phases.setdefault(name, serving.Phase(failure=message))
    return Graded(device, phases)


@pytest.fixture(scope="session")
def judge_model():
    with intra_op_threads(1):
        yield batching.serve_model(batching.ServeConfig(seed=0))


@pytest.fixture(scope="session")
def scenarios(device, seed, tmp_path_factory) -> list[Scenario]:
    """The three faults, each on its own course service (started together, run one after the other), in the
    seed's order; onsets 1.5-2.4 s into a steady 4 requests/s (evenly spaced)."""

    s = seed % 10_000
    order = list(DIAG_FAULTS)
    random.Random(s).shuffle(order)
    empty = tmp_path_factory.mktemp("diag-app")
    out, servers = [], []
    try:
        for fault in order:
            scratch = short_scratch(tmp_path_factory, f"diag-{fault.split('_')[0]}")
            flag = scratch / "slow.flag"
            platform = {"seed": s, "faults": {"slow_file": str(flag)}}
            env = {**ps.platform_config(device).to_env(), ps.PLATFORM_ENV: json.dumps(platform)}
            servers.append((fault, flag, serving.start(empty, "infracourse.kit.platform_service:app",
                                                        scratch=scratch, env=env, device=device)))
        for i, (fault, flag, server) in enumerate(servers):
            sc = Scenario(fault)
            try:
                serving.wait_ready(server, 90)
                run_scenario(server, sc, s + 100 * i, 1.5 + ((s + i) % 10) * 0.1, flag)
            except Exception as exc:  # noqa: BLE001 - a course service that did not start: a course bug
                sc.failure = f"the judge's {fault} scenario could not run ({type(exc).__name__}: {exc})"
            out.append(sc)
    finally:
        for _, _, server in servers:
            serving.stop(server)
    return out
