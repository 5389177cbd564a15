"""Week 12 proves its grader: the solution passes, the starter fails saying what to write, each wrong variant
the issue names fails the check meant for it, and honest solutions in two other styles
(tests/fixtures/week12-honest, a file per style) pass."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, handout_solution

pytestmark = pytest.mark.slow

HONEST = Path(__file__).parent / "fixtures" / "week12-honest"


def _edits(*changes):
    """Several replace_once edits of one file, applied in order."""
    def _edit(text: str) -> str:
        for change in changes:
            text = change(text)
        return text

    return _edit


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week12")
    if machine.gpu_count < 2:
        assert "2 CUDA GPUs" in checks["ddp-multi-gpu"].message


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week12", source="starter", stamp=False)
    assert not result.complete
    for check in ("ddp-matches-single", "shards-disjoint-complete", "one-allreduce-per-step", "rank0-checkpoint",
                  "overlap-observed"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
        assert "write train_ddp.train" in checks[check].message
    assert checks["report"].status == "failed"


VARIANTS = {
    # the partial sums are all-reduced every micro-step: the same weights, A times the communication
    "no no_sync on the first micro-steps": ("one-allreduce-per-step", {"train_ddp.py": replace_once(
        "sync = nullcontext() if overlap and micro == accumulation - 1 else model.no_sync()",
        "sync = nullcontext() if overlap else model.no_sync()")}),
    "no set_epoch": ("shards-disjoint-complete", {"train_ddp.py": replace_once(
        "        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n", "")}),
    "loss not divided by the accumulation": ("ddp-matches-single", {"train_ddp.py": replace_once(
        " / accumulation  # mean over the A pieces", "")}),
    "every rank writes the checkpoint": ("rank0-checkpoint", {"train_ddp.py": _edits(
        replace_once("        if rank == 0:  # one writer; the others' weights are identical\n",
                     "        if True:  # every rank writes, each through its own temporary file\n"),
        replace_once('torch.save({"model": params, "step": step}, path.with_suffix(".tmp"))\n'
                     '            os.replace(path.with_suffix(".tmp"), path)',
                     'torch.save({"model": params, "step": step}, path.with_suffix(f".{rank}.tmp"))\n'
                     '            os.replace(path.with_suffix(f".{rank}.tmp"), path)'))}),
    # a rate 10x off, invented downward: the report's 97779 was measured at load, and an idle 2-core machine
    # runs ~190000, so 10x upward was only 5.1x off the grader's figure, at the edge of the 5x tolerance
    "invented samples/s in the report": ("report", {"report.md": replace_once(
        "samples_per_s: 97779 ", "samples_per_s: 9778  ")}),
    # a communication share not measured: the course's hook times the all-reduce at 0.4-0.6 of the step
    "invented communication share in the report": ("report", {"report.md": replace_once(
        "comm_share: 0.58 ", "comm_share: 0.05 ")}),
    # class 4 of issue 29, figures off by 2-3x that a 5x comparison with a re-measurement lets through: each
    # breaks a relation between the block's own figures, which holds at any load
    "MFU from the forward FLOPs only (3x low)": ("figures-follow", {"report.md": replace_once(
        "mfu: 0.219 ", "mfu: 0.073 ")}),
    "one rank's samples/s reported as the world's": ("figures-follow", {"report.md": replace_once(
        "samples_per_s: 97779 ", "samples_per_s: 48890 ")}),
    "strong efficiency T1/T2 instead of T1/(2 x T2)": ("figures-follow", {"report.md": replace_once(
        "strong_efficiency: 0.501 ", "strong_efficiency: 1.002 ")}),
    "weak efficiency that does not follow from its timings": ("figures-follow", {"report.md": replace_once(
        "weak_efficiency: 0.506 ", "weak_efficiency: 0.61  ")}),
    # issue 29, class 8: communication/computation overlap, observed by the course's hooks (order, not speed).
    # An "overlapped" mode that reduces after backward anyway: the same weights, no all-reduce during backward
    "overlapped mode that all-reduces after backward": ("overlap-observed", {"train_ddp.py": _edits(
        replace_once("sync = nullcontext() if overlap and micro == accumulation - 1 else model.no_sync()",
                     "sync = model.no_sync()  # reduce after backward, whatever the mode"),
        replace_once("            if not overlap:\n                average_gradients(model)\n",
                     "            average_gradients(model)\n"))}),
    # DDP with its default buckets whatever bucket_cap_mb says: one bucket, which can only start after the last
    # gradient, so nothing overlaps (the weights are right)
    "overlapped mode with one bucket (bucket_cap_mb ignored)": ("overlap-observed", {"train_ddp.py": replace_once(
        "device_ids=[device] if device != \"cpu\" else None,\n                bucket_cap_mb=bucket_cap_mb)",
        "device_ids=[device] if device != \"cpu\" else None)")}),
    # without overlap DDP still syncs on the last micro-step, then the explicit all-reduce averages the average
    # again: the same weights, but the all-reduce ran during backward
    "non-overlapped mode that leaves DDP's all-reduce on": ("overlap-observed", {"train_ddp.py": replace_once(
        "sync = nullcontext() if overlap and micro == accumulation - 1 else model.no_sync()",
        "sync = nullcontext() if micro == accumulation - 1 else model.no_sync()")}),
    "non-overlapped mode that skips the all-reduce": ("overlap-observed", {"train_ddp.py": replace_once(
        "            if not overlap:\n                average_gradients(model)\n", "")}),
    # the gradients summed over the ranks, not averaged: twice the step of the reference
    "non-overlapped mode that does not average": ("overlap-observed", {"train_ddp.py": replace_once(
        "    flat /= dist.get_world_size()\n", "")}),
    # a train() written before the overlap mode: train(overlap=False) raises TypeError in every rank, which
    # costs the overlap check only (run_experiments stops at the experiment that raised; the grader runs the
    # overlap experiments last in world 2)
    "train() without the overlap mode": ("overlap-observed", {"train_ddp.py": replace_once(
        "comm_hook=None,\n          overlap: bool = True) -> dict:", "comm_hook=None) -> dict:\n    overlap = True")}),
    # overlap figures not measured here, made to agree with each other (a 1.5x gain): a step two CPU ranks never
    # take, 20-30x below the fastest seen at any load (2.4 ms), so they fail even where the grade's contention
    # widens the tolerance the most (5x, times at most 3x); load only lengthens the grader's steps
    "invented overlap figures in the report": ("report", {"report.md": _edits(
        replace_once("overlap_step_ms: 3.49 ", "overlap_step_ms: 0.08 "),
        replace_once("no_overlap_step_ms: 3.26 ", "no_overlap_step_ms: 0.12 "),
        replace_once("overlap_gain: 0.934 ", "overlap_gain: 1.5   "))}),
    # the gain taken the wrong way round (overlapped / not overlapped): it no longer follows from the two steps
    "overlap gain inverted": ("figures-follow", {"report.md": replace_once(
        "overlap_gain: 0.934 ", "overlap_gain: 1.071 ")}),
    # the comm_hook keyword taken and never registered: every weight right, and main()'s all-reduce share (timed
    # by the hook it passes) would print 0; the course passes a hook of its own in the world-2 timed run
    "comm_hook accepted and never registered": ("scaling-measured", {"train_ddp.py": replace_once(
        "    if comm_hook is not None:  # main() times the all-reduces with one; the grader passes its own\n"
        "        model.register_comm_hook(None, comm_hook)\n", "")}),
    # train() returns one rank's throughput: half the global figure in world 2, whatever the load
    "train() returns per-rank samples/s": ("scaling-measured", {"train_ddp.py": replace_once(
        '"samples_per_s": global_batch / median(step_s)', '"samples_per_s": per_rank_batch * accumulation / '
        'median(step_s)')}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    assert_variant_fails(grade_lab, "week12", check_id, edits)


@pytest.mark.parametrize("name", ["exitstack_drop_last.py", "run_object_grouped_microbatches.py"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, name):
    assert_solution_passes(grade_lab, machine, "week12", edits={"train_ddp.py": (HONEST / name).read_text()})


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """train_ddp.py (and its report, from its own runs): by someone who read only the handout, the starter, lab.yaml and
    the kit modules it names (tests/fixtures/week12-handout), never the reference or the graders."""
    assert_solution_passes(grade_lab, machine, "week12", edits=handout_solution("week12"))


def test_the_judges_reference_run_is_out_of_the_learners_reach():
    """kit.ddp_reference is mounted for the ranks (train_ddp builds its model and data from it): the judge's
    single-process run, whose weights a DDP that averages wrongly could have returned as its own, lives beside
    the graders (graders/week12/week12_judging.py), never mounted."""
    from infracourse.kit import ddp_reference
    assert not hasattr(ddp_reference, "reference_train")
