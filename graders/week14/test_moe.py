"""Week 14, expert parallelism: the learner's moe_layer on 2 ranks (2 experts each, top-2, a capacity per expert
and sending rank) against the dense mixture of experts computed by the judge (week14_references.dense_moe).
The experts are course modules that count the token rows they are given."""
from __future__ import annotations

import pytest
import torch

from infracourse.grader import LabCheckFailed
import week14_references as ref
from infracourse.kit.dist_probes import collectives_called


def _where(world) -> str:
    return f"(10 tokens per rank, 4 experts, top-2, capacity {world.capacity}, 2 ranks, seed {world.seed})"


@pytest.mark.check("moe-combine")
def test_combine(world):
    per_rank = world.results("moe", "moe_layer (moe.py)")
    dense = ref.dense_moe(ref.moe_weights(world.seed), 2, world.capacity)
    for rank, out in enumerate(per_rank):
        got, want = out["out"], dense["out"][rank]
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-9, atol=1e-12):
            bad = ((got - want).abs().amax(-1) > 1e-9).nonzero().flatten().tolist() if got.shape == want.shape \
                else f"shape {tuple(got.shape)}"
            raise LabCheckFailed(f"rank {rank}: moe_layer's output differs from the dense mixture of experts at "
                                 f"tokens {bad} {_where(world)}; each token's output is the sum over its kept "
                                 "experts of gate x expert(token), gates renormalised over its top-k")


@pytest.mark.check("moe-dispatch")
def test_dispatch(world):
    per_rank = world.results("moe", "moe_layer (moe.py)")
    dense = ref.dense_moe(ref.moe_weights(world.seed), 2, world.capacity)
    rows = [n for out in per_rank for n in out["expert_rows"]]
    if rows != dense["expert_rows"]:
        raise LabCheckFailed(f"the experts were given {rows} token rows (experts 0-3), expected {dense['expert_rows']}"
                             f" {_where(world)}: every kept assignment reaches its expert exactly once, and an "
                             "expert never sees an assignment past its capacity")
    dropped = [out["dropped"] for out in per_rank]
    if dropped != dense["dropped"]:
        raise LabCheckFailed(f"moe_layer reported {dropped} dropped assignments on ranks 0, 1; expected "
                             f"{dense['dropped']} {_where(world)}: count each assignment past its expert's "
                             "capacity (first come, in token order)")
    for rank in range(2):
        called = collectives_called({"calls": world.calls(rank, "moe")})
        if not any(op in called for op in ("all_to_all", "all_to_all_single")):
            raise LabCheckFailed(f"rank {rank}: moe_layer made {called or 'no collective calls'}; tokens go to the "
                                 f"ranks that hold their experts with all_to_all (dispatch) and come back the same "
                                 f"way (combine) (seed {world.seed})")
