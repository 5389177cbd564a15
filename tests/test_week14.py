"""Week 14 proves its grader: the solution passes, the starter fails, an honest solution in another style
(tests/fixtures/week14-honest) passes, and each wrong variant the issue names fails its check."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails

HONEST = Path(__file__).parent / "fixtures" / "week14-honest"


@pytest.mark.slow
def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week14")
