"""Week 17: the learner's server, started once per grade (infracourse.grading.serving: uvicorn in the sandbox, on
a Unix socket), driven by the judge through phases whose evidence the checks read:

  load        the load point (kit.batching.bench_specs, the grade's seed: 384 requests, 32 in flight) with the
              kit's load generator, the server's /debug/state sampled meanwhile, its process's peak RSS read here
  starvation  every slot and block taken, then 31 requests at once into the queue, a 100-token prompt 9th
              among 8-token ones
  disconnect  a long request's stream closed after 2 tokens: is it gone, are its blocks back, before it could
              have finished?
  timeout     a request with a deadline (timeout_s) shorter than its generation
  burst       more requests at once than the running batch plus the queue hold: 429 (or 503) for the rest
  pressure    the token budget saturated, the pool too small for the running sequences (preemption forced),
              later arrivals and a request with a deadline queued behind them; the course's ModelRunner
              journals every step's pieces, which the checks hold against the scheduler's rules
  matrix      three cells of the learner's load matrix run again (kit.load_matrix.run_cell, the learner's seeds):
              the heaviest closed-loop cell, its one-user control and the bursty open-loop cell

and, for the throughput check, the course's static-batching server (kit.static_server) on the same load point.
What the server says about itself (/debug/state) is evidence, held against what the judge saw on the wire.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infracourse.grader import serving
from infracourse.kit import batching
from infracourse.kit.threads import intra_op_threads
from infracourse.kit.hf_checkpoint import make_and_describe
from infracourse.kit.llama import Llama
from week17_judging import (GPU_CHECKPOINT, JOURNAL, LIVE_SERVERS, MATRIX_DIR, Served, keep_phase, matrix_seeds,
                            phase_burst, phase_disconnect, phase_load, phase_matrix, phase_pressure, phase_starvation,
                            phase_timeout, require_own_server)


@pytest.fixture(scope="session")
def learner_server(learner, device, tmp_path_factory):
    """The learner's server, up for the whole grade (the throughput check may measure it again). The course's
    ModelRunner journals every step into its scratch folder (its working folder): JOURNAL."""
    require_own_server(learner.root)
    cfg = dataclasses.replace(batching.bench_config(device), step_journal=JOURNAL)
    with serving.serve(learner.root, "server:app", scratch=tmp_path_factory.mktemp("srv"), env=cfg.to_env(),
                       ready_timeout_s=60, device=device) as server:
        LIVE_SERVERS.append(server)  # paused while gpu-continuous-batching times the device
        try:
            yield server
        finally:
            LIVE_SERVERS.remove(server)


# the checks that read each phase: a partial grade runs only the phases its checks read (graded_checks). The
# timeout probe's deadline comes from the load phase's time per token, so request-timeout needs the load too
PHASE_CHECKS = {"load": {"blocks-freed", "greedy-outputs", "throughput-vs-static", "request-timeout"},
                "starvation": {"no-starvation"}, "disconnect": {"disconnect-frees"}, "timeout": {"request-timeout"},
                "burst": {"backpressure"}, "pressure": {"preemption", "request-timeout", "token-budget"},
                "matrix": {"load-matrix"}}


@pytest.fixture(scope="session")
def served(learner_server, learner, seed, device, graded_checks) -> Served:
    server, cfg, s = learner_server, batching.bench_config(device), seed % 10_000
    wanted = {name for name, readers in PHASE_CHECKS.items() if readers & graded_checks}
    phases: dict[str, serving.Phase] = {}
    if "load" in wanted:
        keep_phase(phases, "load", server, phase_load, s)
    if "starvation" in wanted:
        keep_phase(phases, "starvation", server, phase_starvation, s, cfg)
    if "disconnect" in wanted:
        keep_phase(phases, "disconnect", server, phase_disconnect, s, cfg.step_floor_ms / 1000)
    if "timeout" in wanted:
        itl = 0.01  # the load point's median TPOT, s: the timeout probe's deadline is well under its generation
        if not phases["load"].failure:
            itl = max(1e-4, phases["load"].data["metrics"]["tpot_ms"]["median"] / 1000)
        keep_phase(phases, "timeout", server, phase_timeout, s, itl)
    if "burst" in wanted:
        keep_phase(phases, "burst", server, phase_burst, s, cfg)
    if "pressure" in wanted:
        keep_phase(phases, "pressure", server, phase_pressure, s, cfg, Path(server.uds).parent / JOURNAL)
    if "matrix" in wanted:
        keep_phase(phases, "matrix", server, phase_matrix, matrix_seeds(learner.path(MATRIX_DIR) / "matrix.json"))
    return Served(s, cfg, phases, server.log_tail(20000))


@pytest.fixture(scope="session")
def judge_model():
    with intra_op_threads(1):
        yield batching.serve_model(batching.ServeConfig(seed=batching.bench_config().seed))  # on the CPU


@pytest.fixture(scope="session")
def static_server(device, tmp_path_factory):
    """The course's static-batching server (kit.static_server), same limits; nothing of the learner's on its
    import path."""
    empty = tmp_path_factory.mktemp("static-app")
    with serving.serve(empty, "infracourse.kit.static_server:app", scratch=tmp_path_factory.mktemp("srv-static"),
                       env=batching.bench_config(device).to_env(), ready_timeout_s=60, device=device) as server:
        yield server


@pytest.fixture(scope="session")
def gpu_checkpoint(seed, tmp_path_factory):
    """The GPU check's checkpoint (GPU_CHECKPOINT, bf16, from the grade's seed), written once per grade."""
    folder = tmp_path_factory.mktemp("gpu-checkpoint") / "checkpoint"
    make_and_describe(folder, GPU_CHECKPOINT, dtype="bf16", seed=seed % 10_000)
    return folder


@pytest.fixture(scope="session")
def gpu_judge_model(gpu_checkpoint):
    """The judge's copy of that checkpoint on the device, loaded before any server of the check starts."""
    return Llama.from_checkpoint(gpu_checkpoint, device="cuda")
