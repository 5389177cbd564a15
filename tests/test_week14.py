"""Week 14 proves its grader: the solution passes, the starter fails, an honest solution in another style
(tests/fixtures/week14-honest) passes, and each wrong variant the issue names fails its check."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes
from reportproof import invented, reworded

HONEST = Path(__file__).parent / "fixtures" / "week14-honest"


@pytest.mark.slow
def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week14")


@pytest.mark.slow
def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week14", source="starter", stamp=False)
    assert not result.complete
    for check in ("tp-forward", "pipeline-bubble", "pipeline-gpipe", "pipeline-two-stage", "moe-combine",
                  "recovery-params", "report"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
    assert "not written" in checks["tp-forward"].message
    assert "not written" in checks["recovery-resume"].message
    assert "in your own words" in checks["report"].message


# Each grade carries several of the mistakes, each in its own experiment (one launch runs them all, and
# they do not touch each other), so one grade proves several checks; each check's message names its mistake.
FIRST = {  # row-parallel without g, bubble (p-1)/m (in the code and the report), drops not counted, restarts
           # from step 0
    "report.md": invented("bubble_fraction_p4_m8", 11 / 8),
    "tensor_parallel.py": replace_once("y = ReduceFromParallel.apply(h @ w2_shard.T)", "y = h @ w2_shard.T"),
    "pipeline.py": replace_once("return (stages - 1) / (microbatches + stages - 1)",
                                "return (stages - 1) / microbatches"),
    "moe.py": replace_once("dropped = int((~keep).sum())", "dropped = 0"),
    "elastic_train.py": replace_once("    if whole:\n", "    if False:  # always from the start\n"),
}
SECOND = {  # two all-reduces per forward, microbatch losses not scaled, a token twice through its expert,
            # the newest checkpoint folder loaded whatever its state
    "tensor_parallel.py": replace_once("        return x.view_as(x)\n",
                                       "        x = x.clone()\n        dist.all_reduce(x)\n"
                                       "        return x / dist.get_world_size()\n"),
    "pipeline.py": replace_once("loss = F.mse_loss(h @ weight.T + bias, target) / microbatches",
                                "loss = F.mse_loss(h @ weight.T + bias, target)"),
    "moe.py": replace_once("            outputs[rows] = module(inputs[rows])\n",
                           "            module(inputs[rows])  # a first pass, thrown away\n"
                           "            outputs[rows] = module(inputs[rows])\n"),
    "elastic_train.py": replace_once('if (folder / MARKER).is_file() and (folder / ".metadata").is_file():',
                                     "if True:"),
}


@pytest.mark.slow
@pytest.mark.variant
def test_first_set_of_mistakes_fails_each_check(grade_lab):
    result, checks = grade_lab("week14", edits=FIRST)
    assert not result.complete
    expected = {"tp-forward": "partial sum", "pipeline-bubble": "(p-1)/(m+p-1)", "moe-dispatch": "dropped",
                "recovery-resume": "resumed from step 0", "report": "bubble_fraction_p4_m8"}
    for check, words in expected.items():
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
        assert words in checks[check].message, (check, checks[check].message)
    assert checks["recovery-params"].status == "passed", checks["recovery-params"].message  # same params


@pytest.mark.slow
@pytest.mark.variant
def test_second_set_of_mistakes_fails_each_check(grade_lab):
    result, checks = grade_lab("week14", edits=SECOND)
    assert not result.complete
    expected = {"tp-communication": "exactly one all-reduce", "pipeline-two-stage": "divided by m",
                "moe-dispatch": "token rows", "recovery-resume": "half-written"}
    for check, words in expected.items():
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
        assert words in checks[check].message, (check, checks[check].message)
    assert checks["tp-forward"].status == "passed", checks["tp-forward"].message  # the output is right


@pytest.mark.slow
def test_honest_solution_in_another_style_passes(grade_lab, machine):
    """Modules holding Megatron shards with one autograd.Function for f and g; GPipe in closed form and 1F1B
    from per-stage clocks; the 2-stage runner one microbatch at a time over batch_isend_irecv with the loss
    summed over the whole batch's elements; capacity by a Python loop, dispatch of features and expert ids in
    one payload; torch.optim.SGD with DCP's own .metadata as the completeness test. Its report is the
    solution's, reworded."""
    edits = {name: (HONEST / name).read_text()
             for name in ("tensor_parallel.py", "pipeline.py", "moe.py", "elastic_train.py")}
    edits["report.md"] = reworded  # the same facts in other words
    assert_solution_passes(grade_lab, machine, "week14", edits=edits)
