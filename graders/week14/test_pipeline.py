"""Week 14, pipeline parallelism: the learner's schedules read by the judge's rules (week14_references.
check_schedule: dependencies, one action per stage per time step, 1F1B's in-flight bound), the bubble fraction,
and a 2-stage runner on 2 ranks whose gradients must equal one process's on the whole batch."""
from __future__ import annotations

import math

import pytest
import torch

from infracourse.grader import LabCheckFailed
import week14_references as ref
from infracourse.kit.dist_probes import collectives_called, messages_sent
from week14_judging import MICROBATCHES


def cases(seed: int) -> list[tuple[int, int]]:
    return [(2, 4), (4, 8), (3, 2), (4, 1), (2 + seed % 3, 5 + seed % 4)]


@pytest.mark.check("pipeline-bubble")
def test_bubble_fraction(learner, seed):
    pipeline = learner.module("pipeline")
    for p, m in cases(seed):
        got = pipeline.bubble_fraction(p, m)
        want = ref.bubble_fraction(p, m)
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            raise LabCheckFailed(
                f"bubble_fraction({p}, {m}) returned {got!r}, expected (p-1)/(m+p-1) = {want:.4f}: with p stages "
                f"and m microbatches each stage is busy for m forward and m backward time steps of a schedule "
                f"2(m+p-1) long (the p-1 steps of filling and of draining are idle)")


def _require_schedule(pipeline, name: str, p: int, m: int, max_in_flight: int | None, seed: int) -> dict:
    schedule = getattr(pipeline, name)(p, m)
    seen = ref.check_schedule(schedule, p, m, max_in_flight)
    where = f"{name}({p}, {m}), seed {seed}"
    if seen["errors"]:
        raise LabCheckFailed(f"{where}: {seen['errors'][0]}" + (f" (and {len(seen['errors']) - 1} more problems)"
                                                                   if len(seen["errors"]) > 1 else ""))
    want = ref.bubble_fraction(p, m)
    if not math.isclose(seen["bubble"], want, abs_tol=1e-9):
        raise LabCheckFailed(f"{where}: the schedule takes {seen['length']} time steps, so each stage idles "
                             f"{seen['bubble']:.4f} of the time; a tight schedule takes 2(m+p-1) = {2 * (m + p - 1)}"
                             f" steps (bubble {want:.4f}): start each action as soon as what it needs is done")
    return seen


@pytest.mark.check("pipeline-gpipe")
def test_gpipe(learner, seed):
    pipeline = learner.module("pipeline")
    for p, m in cases(seed):
        _require_schedule(pipeline, "gpipe_schedule", p, m, None, seed)


@pytest.mark.check("pipeline-1f1b")
def test_one_f_one_b(learner, seed):
    pipeline = learner.module("pipeline")
    for p, m in cases(seed):
        _require_schedule(pipeline, "one_f_one_b_schedule", p, m, p, seed)


def _require_microbatch_messages(world, weights: dict, where: str) -> None:
    """What the course's probe counted between the stages (scope "two stage"): a pipeline moves one activation
    downstream and one gradient upstream per microbatch, each a microbatch's rows of the hidden layer. A runner
    that sends the whole batch at once gets the same gradients, and no overlap between the stages."""
    rows, hidden = weights["x"].shape[0], weights["w0"].shape[0]
    nbytes = rows * hidden * weights["x"].element_size()  # the whole batch's activations (and their gradients)
    for rank in range(2):
        record = world.calls(rank, "two stage")
        sent = messages_sent({"calls": record})
        received = record.get("recv", 0) + record.get("irecv", 0) + record.get("batched received", 0)
        collectives = collectives_called({"calls": record})
        what = "activations to stage 1" if rank == 0 else "gradients back to stage 0"
        if collectives:
            raise LabCheckFailed(f"rank {rank} called {collectives} inside two_stage_step {where}: the stages "
                                 "talk point to point (send/recv or isend/irecv), one message each way per "
                                 "microbatch")
        if sent != MICROBATCHES or received != MICROBATCHES:
            raise LabCheckFailed(
                f"rank {rank} sent {sent} and received {received} messages in two_stage_step {where}, counted by "
                f"the course's probe; a pipeline of {MICROBATCHES} microbatches sends {MICROBATCHES} "
                f"({what}, one per microbatch, as soon as it is computed) and receives {MICROBATCHES}. Split the "
                f"batch with data.chunk(microbatches) and send each microbatch's tensor on its own: a stage that "
                "sends the whole batch at once gets the same gradients, but the next stage cannot start until "
                "the whole batch is through, so nothing overlaps")
        moved = world.moved(rank, "two stage")
        for direction in ("sent", "received"):
            if moved.get(direction, 0) != nbytes:
                raise LabCheckFailed(
                    f"rank {rank} {direction} {moved.get(direction, 0)} B in two_stage_step {where}; the "
                    f"microbatches' {'activations' if (rank == 0) == (direction == 'sent') else 'gradients'} "
                    f"together are {rows} rows x {hidden} x {weights['x'].element_size()} B = {nbytes} B, each "
                    "sent once")


@pytest.mark.check("pipeline-two-stage")
def test_two_stage(world, record):
    per_rank = world.results("two_stage", "two_stage_step (pipeline.py)")
    weights = ref.two_stage_weights(world.seed)
    dense = ref.two_stage_reference(weights)
    where = f"(batch 8 in {MICROBATCHES} microbatches, 2 ranks, seed {world.seed})"
    scaling = ("the whole batch's mean is the mean of the microbatches' means, so each microbatch's loss is "
               "divided by m before its backward")
    loss = per_rank[1]["loss"]
    if loss is None or loss.numel() != 1 or not torch.allclose(loss.reshape(()), dense["loss"], rtol=1e-9):
        raise LabCheckFailed(f"rank 1's loss is {None if loss is None else loss.tolist()}, expected the whole "
                             f"batch's mean squared error {dense['loss'].item():.6f} {where}: {scaling}")
    for rank in range(2):
        for name, key in (("weight", f"w{rank}"), ("bias", f"b{rank}")):
            got, want = per_rank[rank][f"grad_{name[0]}"], dense[key]
            if got is None:
                raise LabCheckFailed(f"stage {rank}'s {name}.grad is None after two_stage_step {where}: run the "
                                     "backward of every microbatch through this stage")
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-9, atol=1e-12):
                ratio = (got.norm() / want.norm()).item() if got.shape == want.shape else float("nan")
                hint = (f" It is {ratio:.3g}x the single-process gradient: {scaling}."
                        if math.isfinite(ratio) and abs(ratio - 1) > 0.01 else "")
                raise LabCheckFailed(f"stage {rank}'s {name}.grad differs from one process's gradient on the whole "
                                     f"batch {where}.{hint}")
    _require_microbatch_messages(world, weights, where)
    record("messages stage 0 sent per step", messages_sent({"calls": world.calls(0, "two stage")}))
