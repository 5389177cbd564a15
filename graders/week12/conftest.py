"""Week 12's launches, shared by every check of a grade: one torchrun world of 1 rank and one of 2, each calling
the learner's train() for several configurations in one go (kit.ddp_reference.run_experiments, course code in
each rank, counts the DDP bucket reductions with a comm hook, the torch.save calls, and times the optimiser's
steps). What comes back is evidence: checks compare it with kit.ddp_reference's single-process run, computed
here, and with this judge's own clock around each launch."""
from __future__ import annotations

import pytest

from infracourse.kit import ddp_reference as ref
from week12_judging import (GLOBAL_BATCH, PER_RANK, SAMPLES, STEPS, STRONG_GLOBAL, TINY_BUCKET_MB, WEAK_PER_RANK,
                            Launches, launch_world, main_experiment, reference_train, timed_experiment)


@pytest.fixture(scope="session")
def launches(learner, seed, tmp_path_factory) -> Launches:
    s = seed % 10_000
    peak = ref.calibrate_peak_flops()  # before the ranks start: nothing else of this grade competes for a core
    one = launch_world(learner, tmp_path_factory.mktemp("world1"), 1, {
        "main": main_experiment(GLOBAL_BATCH // PER_RANK, s),
        "weak": timed_experiment(WEAK_PER_RANK, s), "strong": timed_experiment(STRONG_GLOBAL, s)}, "cpu")
    two = launch_world(learner, tmp_path_factory.mktemp("world2"), 2, {
        "main": main_experiment(GLOBAL_BATCH // (2 * PER_RANK), s, checkpoint=True),
        "buckets": main_experiment(GLOBAL_BATCH // (2 * PER_RANK), s, bucket_cap_mb=TINY_BUCKET_MB),
        # with the course's own comm hook passed in: train() must register it (main() times the share with one)
        "timed": timed_experiment(WEAK_PER_RANK, s, comm_hook="course"),
        # last, so that a train() without the overlap mode costs only the overlap check: the same gradients
        # all-reduced after backward, then both modes timed with buckets small enough to overlap at all
        "sequential": main_experiment(GLOBAL_BATCH // (2 * PER_RANK), s, bucket_cap_mb=TINY_BUCKET_MB, overlap=False),
        "timed-overlap": timed_experiment(WEAK_PER_RANK, s, bucket_cap_mb=TINY_BUCKET_MB, overlap=True),
        "timed-sequential": timed_experiment(WEAK_PER_RANK, s, bucket_cap_mb=TINY_BUCKET_MB, overlap=False)}, "cpu")
    return Launches(s, peak, one, two)


@pytest.fixture(scope="session")
def reference(launches) -> tuple[dict, list[float]]:
    """The course's single-process run with the global batch (kit code, never the learner's)."""
    return reference_train(STEPS, GLOBAL_BATCH, SAMPLES, launches.seed)
