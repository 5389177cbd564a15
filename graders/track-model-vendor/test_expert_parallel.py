"""Week 23: the learner's expert-parallel ep_moe on 4 CPU ranks (gloo), one launch (conftest.ep): equal to the
dense reference, every (token, expert) pair dispatched and combined exactly once (counted by the course's
expert modules, never by the learner), capacity drops counted, the EPLB placement lowering the maximum rank
load the judge counts, and the all_to_all bytes estimate against the bytes the judge counts."""
from __future__ import annotations

import pytest

from infracourse.grader import LabCheckFailed, check_formula, check_measured
from infracourse.kit import moe as kit
from track_model_vendor_judging import (SMALL_WORLD, all_to_all_bytes, combined_once, compare_outputs,
                                        learner_placement, pairs_once, require_all_to_all, skewed_load)

DTYPE_BYTES = 8        # the launch's tensors are float64
EPLB_GAIN = 0.8        # the rebalanced maximum rank load must be at most 0.8 x the contiguous one
BYTES_FACTOR = 1.25    # the estimate (uniform routing on average) against the bytes counted for the grade's routing


@pytest.mark.check("ep-equals-dense")
def test_ep_equals_dense(ep, ep2):
    for name in ("uniform-capacity", "skewed-contiguous"):
        compare_outputs(ep, name)
    compare_outputs(ep2, "uniform-capacity")


@pytest.mark.check("dispatch-combine-once")
def test_dispatch_combine_once(ep, ep2):
    for launch, names in ((ep, ("uniform-capacity", "uniform-count", "uniform-free", "skewed-contiguous")),
                          (ep2, SMALL_WORLD)):
        for name in names:
            require_all_to_all(launch, name)
            pairs_once(launch, name)
    for launch, names in ((ep, ("uniform-count", "uniform-free")), (ep2, ("uniform-count",))):
        for name in names:
            combined_once(launch, name)


@pytest.mark.check("capacity-drops")
def test_capacity_drops(ep, ep2, record):
    for launch, name in ((ep, "uniform-capacity"), (ep, "uniform-count"), (ep, "uniform-free"),
                         (ep2, "uniform-capacity")):
        want = launch.reference(name)["dropped"]
        got = [result["dropped"] for result in launch.results(name)]
        if launch is ep and name == "uniform-capacity":
            record("dropped assignments (all ranks)", float(sum(x or 0 for x in got)), target=float(sum(want)))
        if got != want:
            raise LabCheckFailed(
                f"ep_moe reported {got} dropped assignments on ranks 0..{launch.world - 1}; the judge counts {want} "
                f"{launch.where(name)}. Every assignment past its expert's capacity is dropped AND counted: a silent "
                "drop hides lost tokens from whoever reads your numbers")


def _rank_loads(per_rank: list[dict]) -> list[int]:
    return [sum(len(record["seen"]) for record in result["experts"]) for result in per_rank]


@pytest.mark.check("eplb-rebalance")
def test_eplb_rebalance(ep, learner, seed, record):
    # the placement for the grade's own skewed routing, judged by the EPLB model (even split over replicas)
    load = skewed_load(seed, ep.world)
    placement, error = learner_placement(learner, load, ep.world)
    if placement is None:
        raise LabCheckFailed(f"{error} (skewed routing seed {seed}, per-expert load {load})")
    per = kit.EXPERTS // ep.world
    before = max(sum(load[r * per:(r + 1) * per]) for r in range(ep.world))
    after = max(kit.balanced_split_loads(placement, load))
    if after > EPLB_GAIN * before:
        raise LabCheckFailed(
            f"eplb_placement({load}, {ep.world}, {kit.slots_for(ep.world)}) = {placement}: with each expert's tokens "
            f"split evenly over its replicas the busiest rank still gets {after:.1f} tokens, against {before} with "
            f"expert e on rank e // {kit.EXPERTS // ep.world} (allowed at most {EPLB_GAIN} x that). Replicate the "
            "experts with the largest load per replica, then put the heaviest replicas on the least-loaded ranks")
    # the fixed skewed trace, run on the ranks: the judge counts what each rank's experts were given
    if ep.placement is None:
        raise LabCheckFailed(f"{ep.placement_error} (the fixed skewed trace, seed {kit.FIXED_SEED})")
    compare_outputs(ep, "skewed-eplb")
    require_all_to_all(ep, "skewed-eplb")
    pairs_once(ep, "skewed-eplb")
    contiguous = _rank_loads(ep.results("skewed-contiguous"))
    rebalanced = _rank_loads(ep.results("skewed-eplb"))
    expected_before = kit.routing_stats(ep.reference("skewed-contiguous")["expert"].reshape(-1, kit.TOP_K), None,
                                        kit.EXPERTS, ep.world)["tokens_per_rank"]
    for rank, result in enumerate(ep.results("skewed-eplb")):
        counted = [len(r["seen"]) for r in result["experts"]]
        if result["load"] != counted:
            raise LabCheckFailed(f"rank {rank}: ep_moe reported load {result['load']} (rows per local slot), the "
                                 f"course's experts counted {counted} {ep.where('skewed-eplb')}: report the token "
                                 "rows each slot's expert processed (padding rows excluded)")
    record("max rank load, contiguous", float(max(contiguous)), target=float(max(expected_before)))
    record("max rank load, eplb", float(max(rebalanced)),
           target=float(max(kit.balanced_split_loads(ep.placement, skewed_load(kit.FIXED_SEED, ep.world)))))
    record("rank imbalance, eplb", kit.imbalance(rebalanced))
    if max(rebalanced) > EPLB_GAIN * max(contiguous):
        raise LabCheckFailed(
            f"on the fixed skewed trace (seed {kit.FIXED_SEED}) your placement {ep.placement} gave the ranks "
            f"{rebalanced} token rows (counted by the course's experts), the contiguous placement {contiguous}: "
            f"the busiest rank must get at most {EPLB_GAIN} x as many. Split each expert's tokens over its "
            "replicas (e.g. the i-th assignment to e goes to replica (i + rank) % replicas)")


@pytest.mark.check("all-to-all-bytes")
def test_all_to_all_bytes(ep, learner, record):

    estimates = learner.module("estimates")
    cases = [{"tokens": t, "hidden": h, "top_k": k, "world": w, "dtype_bytes": b}
             for t, h, k, w, b in ((32, 16, 2, 4, 8), (4096, 7168, 8, 8, 2), (1000, 64, 1, 2, 4),
                                   (512, 1024, 2, 3, 2), (7, 5, 3, 1, 4))]
    check_formula("all_to_all_bytes", estimates.all_to_all_bytes, all_to_all_bytes, cases)
    estimate = float(estimates.all_to_all_bytes(tokens=kit.TOKENS, hidden=kit.D_MODEL, top_k=kit.TOP_K,
                                                world=ep.world, dtype_bytes=DTYPE_BYTES))
    # the judge's count (uniform routing, no capacity): the rows a rank sends to other ranks in the dispatch and
    # the rows it sends back in the combine, from the course experts' records of which token each row was
    per_rank = ep.results("uniform-free")
    sent = [0] * ep.world
    for rank, result in enumerate(per_rank):
        for rec in result["experts"]:
            for token in rec["seen"]:
                owner = int(token) // kit.TOKENS
                if owner != rank:
                    sent[owner] += 1       # dispatch: the owner sent the row here
                    sent[rank] += 1        # combine: this rank sends the result back
    measured = [n * kit.D_MODEL * DTYPE_BYTES for n in sent]
    mean = sum(measured) / len(measured)
    record("all_to_all bytes per rank, estimate", estimate, target=all_to_all_bytes(
        kit.TOKENS, kit.D_MODEL, kit.TOP_K, ep.world, DTYPE_BYTES), unit="B")
    record("all_to_all bytes per rank, counted", mean, unit="B")
    wire = [sum(n for op, n in ((ep.run.probes[r] or {}).get("uniform-free", {}).get("bytes", {})).items()
                if op.startswith("all_to_all")) for r in range(ep.world)]
    # evidence only: what the probe saw pass through all_to_all (output buffers: received bytes, own rows,
    # counts and padding included)
    record("all_to_all bytes per rank, probe", sum(wire) / len(wire), unit="B")
    check_measured("all_to_all_bytes", estimate, mean, BYTES_FACTOR)
