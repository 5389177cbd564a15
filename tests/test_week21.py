"""Week 21 proves its grader: the solution passes, the starter fails every check saying what to write, each
wrong variant the issue names fails its own check (and only it), and an honest gateway in another style
(tests/fixtures/week21-honest) passes. Each grade serves the learner's gateway once; the gateway supervises the
course's model service (kit.platform_service), which the judge kills, loads and redeploys."""
import json
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes
from reportproof import invented, reworded

pytestmark = pytest.mark.slow

HONEST = Path(__file__).parent / "fixtures" / "week21-honest"
SOLUTION = Path(__file__).parent.parent / "labs" / "week21-recovery-capacity" / "solution"


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week21")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week21", source="starter", stamp=False)
    assert not result.complete
    for check in ("supervisor-restarts", "no-request-lost", "executed-once", "capacity-reproduced", "rollback",
                  "class-isolation", "diagnose-faults"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
        assert "not written yet" in checks[check].message, (check, checks[check].message)
    assert checks["report"].status == "failed"


def claimed_rate(factor: float):
    def edit(text: str) -> str:
        data = json.loads(text)
        data["capacity_requests_per_s"] = round(data["capacity_requests_per_s"] * factor, 4)
        return json.dumps(data)
    return edit


VARIANTS = {
    # the supervisor restarts the service, but a request whose stream broke is answered with an error
    "supervisor that loses queued requests": ("no-request-lost", {"gateway.py": replace_once(
        """            log("retry", key=key, delivered=delivered, reason=str(exc)[:200])
            await asyncio.sleep(0.05)""",
        """            yield {"error": {"message": f"the service went away: {exc}", "code": 502}}
            return""")}),
    # a fresh idempotency key for every attempt: each retry is new work for the service
    "retry that executes twice": ("executed-once", {"gateway.py": replace_once(
        """    while True:
        backend: Backend = request.app.state.active""",
        """    while True:
        key = str(uuid.uuid4())
        backend: Backend = request.app.state.active""")}),
    # the sweep's claim is extrapolated, 30 % above what it measured
    "sweep that reports a rate the rerun cannot hold": ("capacity-reproduced", {"capacity.json": claimed_rate(1.3)}),
    # the new version is promoted on /health alone: the canary never runs, nothing rolls back
    "rollback that never happens": ("rollback", {"gateway.py": replace_once(
        """    baseline, canary = await asyncio.gather(canary_sample(old), canary_sample(new))""",
        """    baseline = canary = {"errors": 0, "tpot_s": 0.0}""")}),
    # one diagnosis for every incident
    "diagnose that always answers the same fault": ("diagnose-faults", {"diagnose.py": replace_once(
        "    metrics = sorted(metrics, key=lambda m: m[\"t\"])\n",
        "    metrics = sorted(metrics, key=lambda m: m[\"t\"])\n    return {\"fault\": \"overload\", \"began_at\": metrics[-1][\"t\"]}\n")}),
    # both classes in one queue, in arrival order: class B waits behind the whole flood
    "single shared queue": ("class-isolation", {"gateway.py": replace_once(
        "        self.queues[name].append(waiter)", "        self.queues[\"A\"].append(waiter)")}),
    # a cost per request the run did not give (the grader prices its own rerun at the same device price)
    "invented cost in the report": ("report", {"report.md": invented("usd_per_1k_requests", 2.0)}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_exactly_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    result, checks = grade_lab("week21", edits=edits)
    assert checks[check_id].status == "failed", (checks[check_id].status, checks[check_id].message)
    others = {c.id: (c.status, c.message[:300]) for c in checks.values()
              if c.id not in (check_id, "report") and c.status not in ("passed", "blocked")}
    assert not others, others
    assert not result.complete


def test_honest_gateway_in_another_style_passes(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week21", edits={name: (HONEST / name).read_text() for name in ("gateway.py", "diagnose.py")})


def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week21", edits={"report.md": reworded})
    assert checks["report"].status == "passed", checks["report"].message
