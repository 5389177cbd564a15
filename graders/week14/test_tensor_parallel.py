"""Week 14, tensor parallelism: the learner's parallel_mlp on 2 ranks against the dense MLP (float64).

Each rank gets Megatron's shards of the judge's weights (w1, b1 by rows; w2 by columns); the output must be
the whole dense output on every rank and each shard's gradient the matching slice of the dense gradient."""
from __future__ import annotations

import pytest
import torch

from infracourse.grader import LabCheckFailed
import week14_references as ref

TOL = dict(rtol=1e-9, atol=1e-12)


def _dense(seed):
    weights = ref.mlp_weights(seed)
    return weights, ref.dense_mlp_grads(weights)


def _shape(seed) -> str:
    w = ref.mlp_weights(seed)
    return (f"x {tuple(w['x'].shape)}, w1 {tuple(w['w1'].shape)}, w2 {tuple(w['w2'].shape)}, 2 ranks, seed {seed}")


@pytest.mark.check("tp-forward")
def test_forward(world):
    per_rank = world.results("tensor_parallel", "parallel_mlp (tensor_parallel.py)")
    _, dense = _dense(world.seed)
    for rank, out in enumerate(per_rank):
        y = out["y"]
        if y.shape != dense["y"].shape:
            raise LabCheckFailed(f"rank {rank}: parallel_mlp returned shape {tuple(y.shape)}, expected the whole "
                                 f"output {tuple(dense['y'].shape)} ({_shape(world.seed)})")
        if not torch.allclose(y, dense["y"], **TOL):
            raise LabCheckFailed(
                f"rank {rank}: parallel_mlp's output differs from the dense MLP's by up to "
                f"{(y - dense['y']).abs().max():.3g} ({_shape(world.seed)}). Each rank's row-parallel product is "
                "only a partial sum of y: the ranks' parts must be added (all-reduce, g) before b2 is added once.")


@pytest.mark.check("tp-backward")
def test_backward(world):
    per_rank = world.results("tensor_parallel", "parallel_mlp (tensor_parallel.py)")
    weights, dense = _dense(world.seed)
    for rank, out in enumerate(per_rank):
        expected = ref.mlp_shard(dense, rank, len(per_rank))
        for name, why in (("x", "x is used by every rank: its gradient is the sum of the ranks' parts (f's "
                                "backward is an all-reduce)"),
                          ("w1", "w1's rows are this rank's: its gradient needs the whole dy from g's backward"),
                          ("b1", "b1's slice follows w1's rows"), ("w2", "w2's columns are this rank's"),
                          ("b2", "b2 is added once, after the all-reduce: every rank holds its whole gradient")):
            got = out[name]
            if got.shape != expected[name].shape or not torch.allclose(got, expected[name], **TOL):
                diff = ((got - expected[name]).abs().max().item() if got.shape == expected[name].shape
                        else f"shape {tuple(got.shape)}")
                raise LabCheckFailed(f"rank {rank}: the gradient of {name} differs from the dense MLP's "
                                     f"({diff}; {_shape(world.seed)}); {why}.")


@pytest.mark.check("tp-communication")
def test_one_all_reduce_each_way(world):
    world.results("tensor_parallel", "parallel_mlp (tensor_parallel.py)")
    for rank in range(2):
        for scope, what in (("tp forward", "forward"), ("tp backward", "backward")):
            calls = world.calls(rank, scope)
            if calls != {"all_reduce": 1}:
                raise LabCheckFailed(
                    f"rank {rank}: the MLP block's {what} made {calls or 'no collective calls'}; Megatron's block "
                    f"makes exactly one all-reduce in the forward (g, after the row-parallel layer) and one in the "
                    f"backward (f, for x's gradient) (seed {world.seed})")
