"""Honest variety passes: kernels written from each handout in styles unlike the reference (grid-stride and
persistent programs, 2-D grids, other tiles, split-K and atomics, three-pass and online softmax), graded as a
learner's would be, each completes the week on this machine. A grader that fails one of them is wrong, not
the kernel. The kernels live in tests/fixtures/honest/weekNN/, one file per style."""
from pathlib import Path

import pytest

from labproof import assert_solution_passes

pytestmark = [pytest.mark.slow, pytest.mark.solutions]  # a learner release leaves tests/**/honest/** out

HONEST = Path(__file__).parent / "fixtures" / "honest"
LEARNER_FILE = {"week07": "vector_ops.py", "week08": "softmax.py", "week09": "matmul.py", "week10": "rmsnorm.py"}
KERNELS = [pytest.param(week, path.name, id=f"{week}-{path.stem}")
           for week in LEARNER_FILE for path in sorted((HONEST / week).glob("*.py"))]


def test_at_least_two_styles_per_week():
    for week in LEARNER_FILE:
        assert len(list((HONEST / week).glob("*.py"))) >= 2, week


@pytest.mark.parametrize("week, name", KERNELS)
def test_honest_kernel_completes_the_week(grade_lab, machine, week, name):
    source = (HONEST / week / name).read_text()
    assert_solution_passes(grade_lab, machine, week, edits={LEARNER_FILE[week]: source})
