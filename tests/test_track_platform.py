"""The platform track (weeks 22-24) proves its grader: the solution passes week 22 with only its checks and
week 24 with all of them, the starter fails every check saying what to write, each wrong variant the issue
names fails its own check, and an honest gateway in another style (tests/fixtures/track-platform-honest:
partitioned asyncio semaphores, a supervisor thread) passes. Each grade serves the learner's gateway, which
supervises the course's model service (kit.platform_service); the judge floods, kills and reruns it."""
import re
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails

pytestmark = pytest.mark.slow

TRACK = "platform"
HONEST = Path(__file__).parent / "fixtures" / "track-platform-honest"


def both(*edits):
    def edit(text: str) -> str:
        for change in edits:
            text = change(text)
        return text
    return edit


def test_solution_passes_week22_with_only_its_checks(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week22", track=TRACK)
    assert set(checks) == {"environment-pinned", "run-command", "project-plan", "fifo-baseline"}, sorted(checks)


def test_solution_passes_week24(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week24", track=TRACK)
    assert len(checks) == 14, sorted(checks)


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week24", source="starter", stamp=False, track=TRACK)
    assert not result.complete
    for check in ("class-isolation", "batch-quota", "overload-shed", "restart-recovers", "restart-exactly-once",
                  "quota-too-low"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
        assert "not written yet" in checks[check].message, (check, checks[check].message)
    for check in ("cost-estimate", "capacity-reproduced", "fifo-baseline", "run-command", "environment-pinned",
                  "report"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
    assert "sweep.py" in checks["capacity-reproduced"].message
    assert "raw/baseline.json" in checks["fifo-baseline"].message


# both classes share one queue in arrival order: interactive waits behind the batch backlog
SINGLE_FIFO = both(replace_once("await classes.acquire(name)  #", "await classes.acquire(\"interactive\")  #"),
                   replace_once("classes.release(name)", "classes.release(\"interactive\")"))


def test_single_shared_fifo_fails_class_isolation(grade_lab):
    assert_variant_fails(grade_lab, "week23", "class-isolation", {"gateway.py": SINGLE_FIFO}, track=TRACK)


def test_quota_not_enforced_fails_batch_quota(grade_lab):
    edit = replace_once('"batch": min(limits["batch_slots"], slots)}', '"batch": slots}')
    assert_variant_fails(grade_lab, "week23", "batch-quota", {"gateway.py": edit}, track=TRACK)


def test_lock_that_disagrees_with_the_environment_fails(grade_lab):
    def edit(text: str) -> str:  # the report's environment says one torch, the machine runs another
        changed = re.sub(r"^torch==.*$", "torch==2.0.1", text, count=1, flags=re.MULTILINE)
        assert changed != text, "the solution's lock pins no torch"
        return changed

    assert_variant_fails(grade_lab, "week22", "environment-pinned", {"requirements.lock": edit}, track=TRACK)


def test_honest_gateway_in_another_style_passes(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week24", track=TRACK,
                           edits={"gateway.py": (HONEST / "gateway.py").read_text()})
