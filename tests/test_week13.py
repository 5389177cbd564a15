"""Week 13 proves its grader: the solution passes, the starter fails, each wrong variant the issue names fails
its check, and honest solutions in two other styles (tests/fixtures/week13-honest and week13-b-honest) pass."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, handout_solution
from reportproof import invented

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"


def _edits(*changes):
    """Several replace_once edits of one text, applied in order."""
    def _edit(text: str) -> str:
        for change in changes:
            text = change(text)
        return text

    return _edit


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week13")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week13", source="starter", stamp=False)
    assert not result.complete
    for check in ("memory-exact", "memory-largest-fits", "zero1-matches-adamw", "zero1-state-sharded",
                  "fsdp-matches-ddp", "checkpoint-saves-less", "report"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
    assert "not written yet" in checks["zero1-matches-adamw"].message
    assert "Zero1AdamW.step" in checks["zero1-matches-adamw"].message


# DDP with a plain AdamW over every parameter: right parameters, but every rank keeps all of AdamW's state
FULL_STATE = '''
import torch
import torch.distributed as dist


class Zero1AdamW:
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params = list(params)
        self.inner = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.inner.step()

    def zero_grad(self):
        self.inner.zero_grad(set_to_none=True)
'''

# every step copies in the judge's unsharded AdamW run (then in kit.sharding, mounted for the ranks), the seed read
# from the rank driver's arguments; shard-sized zeros for the course's byte count, one all-reduce for its clock.
# It passed zero1-matches-adamw, zero1-state-sharded and sharded-step-measured without a line of ZeRO-1
COPIES_THE_REFERENCE = '''
import sys

import torch
import torch.distributed as dist

from infracourse.kit.sharding import zero_reference


class Zero1AdamW:
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params = list(params)
        self.world = dist.get_world_size()
        self.seed = torch.load(next(a for a in sys.argv if a.endswith("args.pt")), weights_only=True)["seed"]
        shard = -(-sum(p.numel() for p in self.params) // self.world)
        self.exp_avg, self.exp_avg_sq = torch.zeros(shard), torch.zeros(shard)
        self.steps = 0

    def step(self):
        self.steps += 1
        dist.all_reduce(torch.zeros(1))
        flat, offset = zero_reference(self.seed, self.world, self.steps), 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset: offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''

# the same copy made without the judge's function: kit.sharding's workload replayed as one unsharded AdamW run
# from the seed in the rank driver's arguments (in-process, a learner can always find what its caller holds),
# shard-sized zeros for the byte count, one small all-reduce for the clock. Right parameters, no sharded update:
# the course counts every step's collective bytes, and the shards are never reduced or gathered
REPLAYS_THE_RUN = '''
import sys

import torch
import torch.distributed as dist

from infracourse.kit import sharding as S


class Zero1AdamW:
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params, self.world, self.steps = list(params), dist.get_world_size(), 0
        self.seed = torch.load(next(a for a in sys.argv if a.endswith("args.pt")), weights_only=True)["seed"]
        shard = -(-sum(p.numel() for p in self.params) // self.world)
        self.exp_avg, self.exp_avg_sq = torch.zeros(shard), torch.zeros(shard)

    def step(self):
        self.steps += 1
        dist.all_reduce(torch.zeros(1))
        model = S.make_model(self.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=S.LR, betas=S.BETAS, eps=S.EPS, weight_decay=S.WEIGHT_DECAY)
        for step in range(self.steps):
            S.loss_fn(model, *S.global_batch(self.seed, step, self.world)).backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            for mine, theirs in zip(self.params, model.parameters()):
                mine.copy_(theirs)

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''

VARIANTS = {
    # each rank updates its own shard and never shares it: the other shards stay at their old values
    "ZeRO-1 forgets the all-gather": ("zero1-matches-adamw", {"zero1.py": replace_once(
        "        dist.all_gather_into_tensor(flat, mine.clone())  # every rank gets every updated shard\n", "")}),
    "every rank keeps the full optimizer state": ("zero1-state-sharded", {"zero1.py": FULL_STATE}),
    "ZeRO-1 that copies in the judge's unsharded run": ("zero1-matches-adamw", {"zero1.py": COPIES_THE_REFERENCE}),
    "ZeRO-1 that replays the unsharded run itself": ("zero1-state-sharded", {"zero1.py": REPLAYS_THE_RUN}),
    "fp32 gradients counted under mixed precision": ("memory-exact", {"memory_model.py": replace_once(
        '"bf16-mixed": (2, 2, 12)', '"bf16-mixed": (2, 4, 12)')}),
    # the blocks run as usual; the checkpoint's result is what is returned, but everything was saved anyway
    "checkpointing that saves everything anyway": ("checkpoint-saves-less", {"checkpointing.py": replace_once(
        "        x = checkpoint(block, x, use_reentrant=False)\n",
        "        block(x)\n        x = checkpoint(block, x, use_reentrant=False)\n")}),
    # issue 29 class 3: one FSDP unit, the root; each rank still holds 1/N between steps and trains right, but
    # the whole model is gathered at once for forward and backward
    "FSDP wraps only the root": ("fsdp-matches-ddp", {"fsdp.py": replace_once(
        "            fully_shard(layer)\n", "            pass\n")}),
    "an invented per-rank memory figure": ("report", {"report.md": invented("zero1_state_bytes_per_rank_world2", 0.5)}),
    # "communication is cheap": the course times 0.7-0.95 of a ZeRO-1 step inside its collectives on gloo
    "an invented communication share": ("report", {"report.md": replace_once(
        "zero1_comm_share: 0.77", "zero1_comm_share: 0.05")}),
}


# what a variant's message must say
REASON = {"ZeRO-1 that copies in the judge's unsharded run": "cannot import name 'zero_reference'",
          "ZeRO-1 that replays the unsharded run itself": "less than twice the parameters'"}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    check = assert_variant_fails(grade_lab, "week13", check_id, edits)
    assert REASON.get(name, "") in check.message, check.message


def _first_style_report(text: str) -> str:
    """tests/fixtures/week13-honest: sharded by whole parameters, reduce + broadcast, hand-written AdamW; a
    closed-form largest model; checkpoint_sequential. Its world-3 ranks are less even (greedy by parameter: 592
    of 1,717 elements on the fullest rank), and its report gives its own figures."""
    world3 = replace_once("zero1_state_bytes_per_rank_world3: 4584", "zero1_state_bytes_per_rank_world3: 4736")
    # checkpoint_sequential runs its last segment without checkpointing: that block's insides are saved
    saved = replace_once("saved_activation_bytes_checkpointed: 40960", "saved_activation_bytes_checkpointed: 106496")
    # one reduce and one broadcast per parameter: 28 collectives a step (13,736 B, no padding), each a gloo
    # round trip, so its step is ten times the solution's and nearly all communication
    comm = _edits(replace_once("zero1_comm_bytes_per_step: 13744", "zero1_comm_bytes_per_step: 13736"),
                  replace_once("zero1_step_ms: 2.8", "zero1_step_ms: 35"),
                  replace_once("zero1_comm_share: 0.77", "zero1_comm_share: 0.95"))
    return comm(saved(world3(text)))


# tests/fixtures/week13-b-honest: a DeepSpeed-style ZeRO-1 (a persistent fp32 partition of the flat parameters
# stepped by an inner torch.optim.AdamW, gradients pre-divided and reduce-scattered, all_gather_single back);
# FSDP2 on an explicit device mesh with the last Linear kept gathered from forward to backward; sqrt(L)
# checkpoint segments; the largest model solved exactly over k = ceil(P / N), no search. Its own figures:
_SECOND_STYLE_REPORT = _edits(
    # partition + exp_avg + exp_avg_sq, ceil(P/N) fp32 elements each, and AdamW's 4 B step counter
    replace_once("zero1_state_bytes_per_rank_world2: 6872", "zero1_state_bytes_per_rank_world2: 10312"),
    replace_once("zero1_state_bytes_per_rank_world3: 4584", "zero1_state_bytes_per_rank_world3: 6880"),
    # two segments of two blocks: their two inputs and the head's input, 8,192 B each
    replace_once("saved_activation_bytes_checkpointed: 40960", "saved_activation_bytes_checkpointed: 24576"),
    # the head is not all-gathered again in backward: 20 collectives, 20,400 B a step
    replace_once("fsdp_comm_bytes_per_step: 20808", "fsdp_comm_bytes_per_step: 20400"),
    replace_once("zero1_step_ms: 2.8", "zero1_step_ms: 4"))

HONEST_STYLES = {
    "week13-honest": (("zero1.py", "memory_model.py", "checkpointing.py"), _first_style_report),
    "week13-b-honest": (("zero1.py", "memory_model.py", "checkpointing.py", "fsdp.py"), _SECOND_STYLE_REPORT),
}


@pytest.mark.parametrize("folder", list(HONEST_STYLES))
def test_honest_solution_in_another_style_passes(grade_lab, machine, folder):
    """Honest solutions in two other styles than the reference's (each fixture's module docstrings say how they
    differ), each with its report's figures block holding the figures its own code measures."""
    names, report = HONEST_STYLES[folder]
    edits = {name: (FIXTURES / folder / name).read_text() for name in names}
    edits["report.md"] = report
    assert_solution_passes(grade_lab, machine, "week13", edits=edits)


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """Every file the learner writes, by someone who read only the handout, the starter, lab.yaml and the kit
    modules it names (tests/fixtures/week13-handout): the handout suffices and the grader takes another style."""
    assert_solution_passes(grade_lab, machine, "week13", edits=handout_solution("week13"))


@pytest.mark.slow
def test_the_judges_memory_formula_is_out_of_the_learners_reach(grade_lab):
    """Found by a solution written from the handout alone: kit.sharding, which the sandbox mounts for the ranks,
    held the judge's formula, so a memory_model.py could import it and return the judge's own answers. It is now
    graders/week13/week13_judging.py, which the sandbox never mounts; and since the checks' answers are plain
    numbers, no watched call read the sources, so the memory checks now refuse an import of the engine itself."""
    formula = "from week13_judging import largest_model_that_fits, memory_per_device  # noqa: F401\n"
    _, checks = grade_lab("week13", edits={"memory_model.py": formula}, checks=["memory-exact"])
    assert checks["memory-exact"].status != "passed" and "does not import" in checks["memory-exact"].message, \
        (checks["memory-exact"].status, checks["memory-exact"].message)
    engine = "from infracourse.grading import estimate  # noqa: F401\n" + (
        Path(__file__).parent.parent / "labs" / "week13-zero-fsdp" / "solution" / "memory_model.py").read_text()
    check = assert_variant_fails(grade_lab, "week13", "memory-largest-fits", {"memory_model.py": engine})
    assert "the grader's modules are off limits" in check.message, check.message


def test_the_judges_training_references_are_out_of_the_learners_reach():
    """kit.sharding is mounted for the ranks: it must hold neither the unsharded AdamW run nor the plain forward
    the judge compares with (graders/week13/week13_judging.py holds them), or a Zero1AdamW could copy them in."""
    import importlib.util

    from infracourse.kit import sharding as kit
    path = Path(__file__).parent.parent / "graders" / "week13" / "week13_judging.py"
    spec = importlib.util.spec_from_file_location("week13_judging", path)
    judging = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(judging)
    references = ("zero_reference", "checkpoint_reference")
    assert [name for name in references if hasattr(kit, name)] == []
    assert all(callable(getattr(judging, name)) for name in references)
