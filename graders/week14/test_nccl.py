"""Week 14 on 2 GPUs: the same experiments in one torchrun world over NCCL (CUDA tensors, float64), compared with
the judge's dense references as on the CPU, and the recovery run killed and restarted with the GPUs visible."""
from __future__ import annotations

import pytest
import torch

from infracourse.grader import LabCheckFailed
import week14_references as ref
from week14_judging import World

TOL = dict(rtol=1e-9, atol=1e-12)


@pytest.mark.check("parallel-nccl")
def test_nccl(learner, seed, tmp_path_factory):
    world = World(learner.root, seed, tmp_path_factory.mktemp("nccl"), device="cuda")
    tp = world.results("tensor_parallel", "parallel_mlp (tensor_parallel.py) over NCCL")
    dense = ref.dense_mlp_grads(ref.mlp_weights(seed))
    for rank, out in enumerate(tp):
        if not torch.allclose(out["y"], dense["y"], **TOL) or not torch.allclose(out["x"], dense["x"], **TOL):
            raise LabCheckFailed(f"over NCCL, rank {rank}'s parallel_mlp output or x gradient differs from the dense "
                                 f"MLP's (seed {seed}); on the CPU check tp-forward / tp-backward first")
    stages = world.results("two_stage", "two_stage_step (pipeline.py) over NCCL")
    want = ref.two_stage_reference(ref.two_stage_weights(seed))
    for rank, out in enumerate(stages):
        if out["grad_w"] is None or not torch.allclose(out["grad_w"], want[f"w{rank}"], **TOL):
            raise LabCheckFailed(f"over NCCL, stage {rank}'s weight gradient differs from one process's (seed {seed}):"
                                 " the tensors you send and receive must live on this rank's GPU")
    moe = world.results("moe", "moe_layer (moe.py) over NCCL")
    expected = ref.dense_moe(ref.moe_weights(seed), 2, world.capacity)
    for rank, out in enumerate(moe):
        if not torch.allclose(out["out"], expected["out"][rank], **TOL) or out["dropped"] != expected["dropped"][rank]:
            raise LabCheckFailed(f"over NCCL, rank {rank}'s moe_layer output or drop count differs from the dense "
                                 f"mixture of experts (seed {seed}); NCCL's all_to_all_single needs CUDA tensors, "
                                 "split sizes as Python ints")
