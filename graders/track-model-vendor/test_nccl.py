"""The NCCL paths of ep_moe: one GPU (world size 1, every expert local, the all_to_all still called) and two GPUs
(the same experiments as the CPU launch). Blocked on machines without them; never simulated."""
from __future__ import annotations

import pytest

from infracourse.grader import LabCheckFailed
from track_model_vendor_judging import combined_once, compare_outputs, launch, pairs_once, require_all_to_all


@pytest.mark.check("nccl-single-gpu")
def test_nccl_single_gpu(learner, seed, tmp_path_factory):
    one = launch(learner, seed, tmp_path_factory.mktemp("nccl1"), device="cuda", world=1)
    for name in ("uniform-capacity", "skewed-contiguous"):
        compare_outputs(one, name)
        require_all_to_all(one, name)
    for name in ("uniform-count", "uniform-free"):
        pairs_once(one, name)
        combined_once(one, name)
    if [r["dropped"] for r in one.results("uniform-capacity")] != one.reference("uniform-capacity")["dropped"]:
        raise LabCheckFailed(f"on one GPU ep_moe's dropped count differs from the judge's {one.where('uniform-capacity')}")


@pytest.mark.check("nccl-expert-parallel")
def test_nccl_expert_parallel(learner, seed, tmp_path_factory):
    two = launch(learner, seed, tmp_path_factory.mktemp("nccl2"), device="cuda", world=2)
    for name in ("uniform-capacity", "skewed-contiguous", "skewed-eplb"):
        compare_outputs(two, name)
        require_all_to_all(two, name)
    for name in ("uniform-count", "uniform-free"):
        pairs_once(two, name)
        combined_once(two, name)
    if [r["dropped"] for r in two.results("uniform-capacity")] != two.reference("uniform-capacity")["dropped"]:
        raise LabCheckFailed(f"on two GPUs ep_moe's dropped count differs from the judge's {two.where('uniform-capacity')}")
