"""Week 22: the learner's dense single-process MoE (route + capacity + experts) and routing statistics against
the course's reference (kit.moe), called in the sandboxed worker on the judge's seeded shapes."""
from __future__ import annotations

import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit import moe as kit
from track_model_vendor_judging import refuse_reference_imports

CASES = (("uniform", None), ("uniform", 1.0), ("skewed", 0.75))  # (trace, capacity factor)


@pytest.fixture(scope="module")
def moe(learner):
    refuse_reference_imports(learner.root)
    return learner.module("moe")


def _where(trace, seed, rank, cap) -> str:
    capacity = "no capacity" if cap is None else f"capacity {cap} per expert"
    return (f"({trace} routing seed {seed}, rank {rank}'s {kit.TOKENS} tokens, {kit.EXPERTS} experts, "
            f"top-{kit.TOP_K}, {capacity})")


@pytest.mark.check("dense-baseline")
def test_dense_baseline(moe, seed):
    for trace, factor in CASES:
        c = kit.case(seed, trace)
        cap = kit.capacity_for(kit.TOKENS, kit.TOP_K, kit.EXPERTS, factor)
        ref = kit.dense_moe(c, kit.TOP_K, cap)
        for rank in (0, kit.WORLD - 1):
            where = _where(trace, seed, rank, cap)
            got = moe.route(c["logits"][rank], kit.TOP_K)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                raise LabCheckFailed(f"route returned {type(got).__name__}; return (expert ids, gates) {where}")
            ids, gates = got
            if not torch.equal(torch.as_tensor(ids).long(), ref["expert"][rank]):
                raise LabCheckFailed(f"route's expert ids differ from the top-{kit.TOP_K} of the logits {where}: "
                                     f"token 0 got {torch.as_tensor(ids)[0].tolist()}, expected "
                                     f"{ref['expert'][rank][0].tolist()} (the k largest logits, best first)")
            if not torch.allclose(torch.as_tensor(gates).double(), ref["gate"][rank], rtol=1e-9, atol=1e-12):
                raise LabCheckFailed(f"route's gates differ {where}: token 0 got "
                                     f"{torch.as_tensor(gates)[0].tolist()}, expected {ref['gate'][rank][0].tolist()}"
                                     " (softmax over the k chosen logits, so a token's gates sum to 1)")
            out = moe.dense_moe(c["x"][rank], c["logits"][rank], c["w_in"], c["w_out"], kit.TOP_K, cap)
            if not (isinstance(out, dict) and isinstance(out.get("out"), torch.Tensor)):
                raise LabCheckFailed(f"dense_moe returned {str(out)[:100]}; return {{'out': tensor, 'dropped': int}}")
            want = ref["out"][rank]
            if out["out"].shape != want.shape or not torch.allclose(out["out"].double(), want, rtol=1e-9,
                                                                   atol=1e-12):
                bad = ((out["out"].double() - want).abs().amax(-1) > 1e-9).nonzero().flatten().tolist() \
                    if out["out"].shape == want.shape else f"shape {tuple(out['out'].shape)}"
                raise LabCheckFailed(f"dense_moe's output differs from the course reference at tokens {bad} "
                                     f"{where}: out[t] = sum over t's kept choices of gate x "
                                     "gelu(x[t] @ w_in[e]) @ w_out[e]; a dropped choice adds nothing")
            if out.get("dropped") != ref["dropped"][rank]:
                raise LabCheckFailed(f"dense_moe reported dropped = {out.get('dropped')}, the reference drops "
                                     f"{ref['dropped'][rank]} assignments {where}: each expert accepts the first "
                                     "`capacity` assignments in (token, choice) order, and every other one is "
                                     "dropped AND counted")


@pytest.mark.check("routing-stats")
def test_routing_stats(moe, seed, record):
    for trace, case_seed in (("uniform", seed), ("skewed", seed), ("skewed", kit.FIXED_SEED)):
        ref = kit.dense_moe(kit.case(case_seed, trace), kit.TOP_K, None)
        expert = ref["expert"].reshape(-1, kit.TOP_K)
        want = kit.routing_stats(expert, None, kit.EXPERTS, kit.WORLD)
        got = moe.routing_stats(expert, kit.EXPERTS, kit.WORLD)
        where = (f"({trace} routing seed {case_seed}, {kit.WORLD} ranks x {kit.TOKENS} tokens, {kit.EXPERTS} "
                 f"experts, top-{kit.TOP_K}, expert e on rank e // {kit.EXPERTS // kit.WORLD})")
        if not isinstance(got, dict):
            raise LabCheckFailed(f"routing_stats returned {type(got).__name__}; return a dict {where}")
        for key in ("tokens_per_expert", "tokens_per_rank"):
            if [int(v) for v in (got.get(key) or [])] != want[key]:
                raise LabCheckFailed(f"routing_stats: {key} is {got.get(key)}, the judge counts {want[key]} "
                                     f"{where}: count every (token, choice) assignment")
        for key in ("expert_imbalance", "rank_imbalance"):
            value = got.get(key)
            if not isinstance(value, (int, float)) or abs(value - want[key]) > 1e-9 * want[key]:
                raise LabCheckFailed(f"routing_stats: {key} is {value}, the judge's is {want[key]:.6g} {where}: "
                                     "imbalance is max / mean of the loads")
        if case_seed == kit.FIXED_SEED:
            record("rank imbalance, fixed skewed trace", float(got["rank_imbalance"]), target=want["rank_imbalance"])
