"""Shared fixtures of the week 2 graders: the dataset, the learner's modules, the run's plan drawn from the
seed, one reduced sweep run with the learner's own script under observation (the course's model, handed in as
`trainer`, stamps every step it trains and keeps the batch it trained on), and the grader's own measurement of
a configuration's steady training step.

The learner's code runs in the grading worker, which sees only its scratch folder: the dataset is written
there (the grader checks readers against the seed's arrays, never against those files)."""
import csv
import random

import pytest

from infracourse import bench
from infracourse.grader import LabCheckFailed
from infracourse.kit import data, intra_op
from infracourse.kit.data import ensure_dataset
from infracourse.kit.threads import intra_op_threads
from week02_judging import SECOND_BATCH, Plan, Sweep, process_rss_mb


@pytest.fixture(scope="session")
def plan(seed):
    rng = random.Random(seed)
    return Plan(seed=seed, batch=rng.choice(SECOND_BATCH), readers_batch=rng.randrange(150, 320),
                probe_batch=rng.randrange(96, 256))


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # A tiny model: see infracourse.kit.threads. The learner's steps run in the worker: one thread there too.
    learner.build(intra_op.set_intra_op_threads, 1)
    with intra_op_threads(1):
        yield


@pytest.fixture(scope="session")
def root(learner):
    return ensure_dataset(base=learner.worker.scratch / "datasets")


@pytest.fixture(scope="session")
def loaders(learner):
    return learner.module("loaders")


@pytest.fixture(scope="session")
def script(learner):
    return learner.module("benchmark")


@pytest.fixture(scope="session")
def sweep(script, root, learner, plan):
    run = Sweep(configs=plan.configs)
    out = learner.worker.scratch / "sweep-results.csv"  # written by the worker, read here as untrusted data
    # The course's model and optimiser, stamped: built in the worker, handed to the learner's sweep, which
    # makes one trainer per configuration. What it recorded is the grader's observation of the runs.
    trainer = learner.build(data.StampedTrainer)
    script.sweep(root, [dict(c) for c in run.configs], out, warmup=run.warmup, steps=run.steps, trainer=trainer)
    run.runs = trainer.take()
    if learner.worker.proc is not None:
        run.worker_rss_mb = process_rss_mb(learner.worker.proc.pid)
    if not out.exists():
        raise LabCheckFailed("sweep() wrote no CSV file at the path it was given")
    with out.open(newline="") as fh:
        run.rows = list(csv.DictReader(fh))
    return run


@pytest.fixture(scope="session")
def steady_step(loaders, root, device, learner):
    """steady_step(read, batch_size, workers, course=False) -> (seconds per training step, batch digests),
    measured by the grader.

    The learner's loader (with course=True the course's own per-file loader, kit.data.course_file_loader: a
    baseline never comes from code the learner edits) feeds the course's fixed model in the worker
    (kit.data.StepLoop); each clocked call
    runs STEPS steps (fetch a batch, copy it to the device, train, wait for the device), timed here on the
    host clock from the request to its answer: a step's time includes the host waiting for data, which
    device events do not see, and the one round trip per call is spread over STEPS steps.
    """
    steps = 4

    def measure(read, batch_size, workers, reps=5, course=False):
        make_loader = None if course else loaders.make_loader
        loop = learner.build(data.StepLoop, make_loader, root, read, batch_size, workers, device)
        try:
            timing = bench.measure(lambda: loop(steps), warmup=1, reps=reps, flush_l2=False, device="cpu")
            digests = loop.digests()
        finally:
            loop.close()  # stops persistent loader workers
        return timing.median_s / steps, digests

    return measure
