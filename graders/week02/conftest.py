"""Shared fixtures of the week 2 graders: the dataset, the learner's modules, one reduced sweep run with the
learner's own script, and the grader's own measurement of a configuration's steady training step."""
import csv
from dataclasses import dataclass, field

import pytest
import torch

from infracourse import bench
from infracourse.guard import LabCheckFailed
from infracourse.kit.data import ensure_dataset, new_trainer, to_device, train_step
from infracourse.kit.threads import intra_op_threads

# The reduced sweep the grader re-runs: every read method and worker setting at two batch sizes.
REDUCED = [{"read": read, "batch_size": batch, "workers": workers}
           for read in ("file", "packed") for batch in (32, 128) for workers in (0, 2)]


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread():
    with intra_op_threads(1):  # a tiny model: see infracourse.kit.threads
        yield


@pytest.fixture(scope="session")
def root():
    return ensure_dataset()


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
def sweep(script, root, tmp_path_factory):
    run = Sweep()
    out = tmp_path_factory.mktemp("sweep") / "results.csv"
    script.sweep(root, [dict(c) for c in run.configs], out, warmup=run.warmup, steps=run.steps)
    if not out.exists():
        raise LabCheckFailed("sweep() wrote no CSV file at the path it was given")
    with out.open(newline="") as fh:
        run.rows = list(csv.DictReader(fh))
    return run


@pytest.fixture(scope="session")
def steady_step(loaders, root, device):
    """steady_step(read, batch_size, workers) -> seconds per training step, measured by the grader.

    The learner's loader feeds the course's fixed model; each timed call fetches a batch, copies it to the
    device, trains one step and waits for the device. The host clock (bench.measure with device='cpu') is
    the right one here: a step's time includes the host waiting for data, which device events do not see.
    """
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def measure(read, batch_size, workers, reps=12):
        model, optimizer = new_trainer(device)
        loader = loaders.make_loader(root, read, batch_size, workers)
        batches = iter(loader)

        def step():
            nonlocal batches
            try:
                batch = next(batches)
            except StopIteration:  # a new epoch (the median keeps the restart out of the figure)
                batches = iter(loader)
                batch = next(batches)
            train_step(model, optimizer, *to_device(tuple(batch), device))
            sync()

        timing = bench.measure(step, warmup=3, reps=reps, flush_l2=False, device="cpu")
        del batches, loader  # stops persistent workers
        return timing.median_s

    return measure
