"""Shared fixtures of the week 2 graders: the dataset, the learner's modules, one reduced sweep run with the
learner's own script, and the grader's own measurement of a configuration's steady training step.

The learner's code runs in the grading worker, which sees only its scratch folder: the dataset is written
there (the grader checks readers against the seed's arrays, never against those files)."""
import csv
from dataclasses import dataclass, field

import pytest

from infracourse import bench
from infracourse.grading.remote import WorkerObject
from infracourse.guard import LabCheckFailed
from infracourse.kit.data import ensure_dataset
from infracourse.kit.threads import intra_op_threads

# The reduced sweep the grader re-runs: every read method and worker setting at two batch sizes.
REDUCED = [{"read": read, "batch_size": batch, "workers": workers}
           for read in ("file", "packed") for batch in (32, 128) for workers in (0, 2)]


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # A tiny model: see infracourse.kit.threads. The learner's steps run in the worker: one thread there too.
    learner.worker.build(WorkerObject("infracourse.kit.intra_op:set_intra_op_threads", (1,)))
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


@dataclass
class Sweep:
    """The learner's sweep() over REDUCED, as read back from the CSV it wrote (the deliverable)."""

    configs: list = field(default_factory=lambda: [dict(c) for c in REDUCED])
    warmup: int = 2
    steps: int = 8
    rows: list = field(default_factory=list)


@pytest.fixture(scope="session")
def sweep(script, root, learner):
    run = Sweep()
    out = learner.worker.scratch / "sweep-results.csv"  # written by the worker, read here as untrusted data
    script.sweep(root, [dict(c) for c in run.configs], out, warmup=run.warmup, steps=run.steps)
    if not out.exists():
        raise LabCheckFailed("sweep() wrote no CSV file at the path it was given")
    with out.open(newline="") as fh:
        run.rows = list(csv.DictReader(fh))
    return run


@pytest.fixture(scope="session")
def steady_step(loaders, root, device, learner):
    """steady_step(read, batch_size, workers) -> seconds per training step, measured by the grader.

    The learner's loader feeds the course's fixed model in the worker (kit.data.StepLoop); each clocked call
    runs STEPS steps (fetch a batch, copy it to the device, train, wait for the device), timed here on the
    host clock from the request to its answer: a step's time includes the host waiting for data, which
    device events do not see, and the one round trip per call is spread over STEPS steps.
    """
    steps = 4

    def measure(read, batch_size, workers, reps=5):
        loop = learner.worker.build(WorkerObject("infracourse.kit.data:StepLoop",
                                                 (loaders.make_loader, root, read, batch_size, workers, device)))
        try:
            timing = bench.measure(lambda: loop(steps), warmup=1, reps=reps, flush_l2=False, device="cpu")
        finally:
            loop.close()  # stops persistent loader workers
        return timing.median_s / steps

    return measure
