"""Week 21 proves its grader: the solution passes, the starter fails every check saying what to write, each
wrong variant the issue names fails its own check, and honest solutions in two other styles
(tests/fixtures/week21-honest, tests/fixtures/week21-b-honest) pass. Each grade serves the learner's gateway
once; the gateway supervises the course's model service (kit.platform_service), which the judge kills, loads
and redeploys."""
import json
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import (FIXTURES, assert_solution_passes, assert_variant_fails, handout_solution, not_passed,
                      with_stamped_environment)
from reportproof import invented, reworded

pytestmark = pytest.mark.slow

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


def points_up_to_the_claim(text: str) -> str:
    """capacity.json as a sweep that stopped at its claim writes it: no point above the claim missed the SLO."""
    data = json.loads(text)
    data["points"] = [p for p in data["points"] if p["rate"] <= data["capacity_requests_per_s"] * 1.001]
    return json.dumps(data)


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
    # issue 29 class 4: a P99 TTFT 20 % off the sweep's own point (another run's, or rounded up); it passed while the
    # report was compared only with the judge's 0.9x rerun, within 4x
    "at-capacity TTFT not the sweep's": ("report", {"report.md": invented("ttft_p99_ms_at_capacity", 1.2)}),
    # a claim with no measured miss above it: the sweep stopped (or was cut) at the claim
    "sweep with no miss above its claim": ("capacity-reproduced", {"capacity.json": points_up_to_the_claim}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    """Graded on that check alone (and what it requires): the grade runs only the phase the check reads
    (PHASE_CHECKS), as `infracourse grade week21 --check ID` does."""
    check_id, edits = VARIANTS[name]
    assert_variant_fails(grade_lab, "week21", check_id, edits)


def test_a_supervisor_that_restarts_once_fails_at_the_second_kill(grade_lab):
    """Issue 29 class 1: with one kill per grade, a supervisor that restarts the service once passed. The judge kills
    the replacement too, every grade, and the message names the second kill."""
    once = replace_once("        while not self.stopping:\n", "        while not self.stopping and self.starts < 2:\n")
    check = assert_variant_fails(grade_lab, "week21", "supervisor-restarts", {"gateway.py": once})
    assert "the second time the judge SIGKILLed" in check.message and "not twice" in check.message, check.message


# Issue 29 class 5: the bad version was errors or slowness by the seed's parity, so each half-canary passed every
# other grade. The judge now deploys both in every grade; each half-canary fails on the version it cannot see.
HALF_CANARIES = {
    "canary that compares only errors": ("v3", replace_once(
        """    if canary["errors"] > 0 or canary["tpot_s"] > CANARY_SLOWER * baseline["tpot_s"]:""",
        """    if canary["errors"] > 0:""")),
    "canary that compares only per-token time": ("v2", replace_once(
        """    if canary["errors"] > 0 or canary["tpot_s"] > CANARY_SLOWER * baseline["tpot_s"]:""",
        """    if float("inf") > canary["tpot_s"] > CANARY_SLOWER * baseline["tpot_s"]:""")),
}


@pytest.mark.parametrize("name", list(HALF_CANARIES))
def test_a_canary_that_compares_one_figure_fails_on_the_version_it_misses(grade_lab, name):
    version, edit = HALF_CANARIES[name]
    check = assert_variant_fails(grade_lab, "week21", "rollback", {"gateway.py": edit})
    assert check.message.startswith(f"{version} was bad") and "BOTH" in check.message, check.message


@pytest.mark.parametrize("folder", ["week21-honest", "week21-b-honest"])
def test_honest_gateway_in_another_style_passes(grade_lab, machine, folder):
    """Each folder holds the learner files its style replaces (week21-b-honest: the gateway, diagnose.py and the
    sweep, with the capacity.json that sweep wrote serving that gateway and its report in its own words, stamped
    with this machine's Environment section as a learner's `infracourse report` would)."""
    root = FIXTURES / folder
    edits = {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts}
    if "report.md" in edits:
        edits["report.md"] = with_stamped_environment(edits["report.md"])
    assert_solution_passes(grade_lab, machine, "week21", edits=edits)


def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week21", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def _week21_judge(monkeypatch):
    import importlib.util
    import sys

    graders = SOLUTION.parents[2] / "graders" / "week21"
    monkeypatch.syspath_prepend(str(graders))  # as the grading plugin puts it: the judge's helpers import by name
    spec = importlib.util.spec_from_file_location("week21_judging", graders / "week21_judging.py")
    judge = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, judge)  # its dataclasses look their module up there
    spec.loader.exec_module(judge)
    return judge


class _Service:
    """The judge's view of a course service for its scraper: answers /debug/state after `delay_s` (honouring the
    scrape's timeout as a socket does), or refuses the connection once `gone`."""

    def __init__(self, delay_s: float, gone: bool = False):
        self.delay_s, self.gone = delay_s, gone

    def request(self, method, path, body=None, *, timeout_s=10.0):
        import time

        if self.gone:
            raise ConnectionRefusedError(111, "Connection refused")
        if self.delay_s > timeout_s:
            time.sleep(timeout_s)
            raise TimeoutError("timed out")  # socket.timeout, as a socket raises it
        time.sleep(self.delay_s)
        return 200, {}, json.dumps({"running": 4, "waiting": 110, "requests_total": 130}).encode()


@pytest.mark.parametrize("delay_s,gone,up", [(0.8, False, 1), (0.0, True, 0)])
def test_diagnosis_scrape_reads_a_slow_answer_as_up_and_a_gone_process_as_down(monkeypatch, delay_s, gone, up):
    """Issue 29: under the overload scenario's flood on a loaded CPU, /debug/state answered in ~0.5 s, the judge's
    0.5 s scrape timeout recorded "up 0" and a correct diagnose named the overload a process exit."""
    import threading
    import time

    grader = _week21_judge(monkeypatch)
    out, stop = [], threading.Event()
    scraper = threading.Thread(target=grader._scrape, args=(_Service(delay_s, gone), out, stop), daemon=True)
    scraper.start()
    time.sleep(1.0)
    stop.set()
    scraper.join(grader.SCRAPE_TIMEOUT_S + 1)
    assert out and {m["up"] for m in out} == {up}, out
    if up:
        assert out[0]["waiting"] == 110, out[0]


def _capacity_grade(monkeypatch, claimed: float, good_fraction: float, tpot_ms: float, tpot_p99_ms: float | None = None,
                    learner=None):
    """test_capacity_reproduced on a grade whose 0.9x rerun met the SLO for `good_fraction` of its requests while
    each token took `tpot_ms` on average (`tpot_p99_ms` at P99; no request's tokens to compare: none succeeded).
    `learner`: whose capacity.json the check reads once the rerun held."""
    import importlib.util

    from infracourse.grading.serving import Phase

    _week21_judge(monkeypatch)
    spec = importlib.util.spec_from_file_location("week21_capacity", SOLUTION.parents[2] / "graders" / "week21" /
                                                  "test_capacity.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    stats = {"mean": tpot_ms, "median": tpot_ms, "p99": tpot_p99_ms or tpot_ms}
    duration_s = 96 / (0.9 * claimed)
    run = {"rate": 0.9 * claimed, "n": 96, "good_fraction": good_fraction, "specs": [], "records": [],
           "metrics": {"failed": 0, "completed": 96, "total_output": 96 * 12, "duration_s": duration_s,
                       "ttft_ms": {"p99": 600.0}, "tpot_ms": stats}}
    held = good_fraction >= 0.99
    graded = type("Graded", (), {"device": "cpu", "phases": {"capacity": Phase(data={
        "claimed": claimed, "below": run, "above": {**run, "good_fraction": 0.5},
        "below_first": None if held else 0.85})}})
    check.test_capacity_reproduced(graded, None, lambda *a, **k: None, learner)


@pytest.mark.parametrize("claimed,tpot_ms,busy", [
    (13.4, 25.2, False),   # the machine kept the floor: the claim itself missed
    (13.4, 28.0, True),    # steps 12 % over the floor: 0.9x asked 101 % of what the platform then held
    (11.0, 28.0, False),   # a claim with room to spare missed even at that pace
    (17.4, 40.0, False),   # above the slot ceiling (13.3/s) by 30 %: no load excuses it
])
def test_capacity_miss_fails_and_names_the_pace_when_the_steps_ran_slow(monkeypatch, claimed, tpot_ms, busy):
    """Issue 29: a reference claim rerun at 0.9x on a loaded CPU missed the SLO. The miss still fails (never
    `blocked`: the pace is read through the learner's gateway, so a gateway that delays chunks looks like a busy
    machine, and a blocked check lets a week complete), but its message then names the pace and the load."""
    from infracourse.failures import LabCheckFailed

    with pytest.raises(LabCheckFailed) as caught:
        _capacity_grade(monkeypatch, claimed, good_fraction=0.9, tpot_ms=tpot_ms)
    assert ("may have been too busy" in str(caught.value)) == busy, str(caught.value)
    if claimed > 14.7:
        assert "above what the platform can serve at all" in str(caught.value)
    else:  # a 0.9x miss is run again before it fails
        assert "(run twice: 85.0% the first time)" in str(caught.value)


class _SweptLearner:
    """A learner whose capacity.json claims 13.4/s: that point held with `tpot_p99_ms`, the next 5 % up missed."""

    def __init__(self, folder: Path, tpot_p99_ms: float):
        point = {"rate": 13.4, "requests": 107, "failed": 0, "goodput_fraction": 1.0, "ttft_p99_ms": 120.0,
                 "tpot_p99_ms": tpot_p99_ms, "duration_s": 107 / 13.4 / 0.9}
        points = [point, {**point, "rate": 14.07, "goodput_fraction": 0.9}]
        (folder / "capacity.json").write_text(json.dumps({"capacity_requests_per_s": 13.4, "points": points}))
        self.folder = folder

    def path(self, name: str) -> Path:
        return self.folder / name


@pytest.mark.parametrize("sweep_p99,rerun_mean,rerun_p99,passes", [
    (26.6, 25.2, 27.0, True),    # both at the floor
    (26.6, 31.0, 45.6, True),    # 2026-12-07: the handout's idle sweep against a rerun on a slow, loaded machine
    (26.6, 25.2, 45.6, False),   # the rerun kept the floor's pace, yet its tail is 1.7x the sweep's: not its run
    (15.0, 31.0, 45.6, False),   # under the 25 ms step floor: no rerun, however slow, excuses it
    (80.0, 25.2, 27.0, False),   # a sweep far slower than the rerun (another platform's figures)
    (20.0, 28.0, 27.0, False),   # within 1.5x of the rerun, but under the floor
])
def test_sweep_tail_per_token_time_against_the_rerun(monkeypatch, tmp_path, sweep_p99, rerun_mean, rerun_p99, passes):
    """The sweep's P99 time per token is held within 1.5x of the judge's 0.9x rerun, except where the rerun's steps
    ran slow (a busy machine: its mean over the floor) and the sweep's is the faster one, above the floor: the
    handout solution's honest sweep failed so on a slow machine with the full suite beside it."""
    from infracourse.failures import LabCheckFailed

    learner = _SweptLearner(tmp_path, sweep_p99)
    if passes:
        _capacity_grade(monkeypatch, 13.4, 1.0, rerun_mean, rerun_p99, learner=learner)
        return
    with pytest.raises(LabCheckFailed) as caught:
        _capacity_grade(monkeypatch, 13.4, 1.0, rerun_mean, rerun_p99, learner=learner)
    says = "step floor" if sweep_p99 < 0.95 * 25.0 else "more than 1.5x apart"
    assert "tpot p99" in str(caught.value) and says in str(caught.value), str(caught.value)


def test_restart_at_rest_counts_cpu_seconds_not_the_wait(monkeypatch):
    """Issue 29: the report's time_to_ready_s (written on an idle machine) failed against a wall-clock restart timed
    at load (1.15 s written, 9-12 s measured with 3-4 grades on 2 cores). The judge now compares it with the
    restart at rest: the time until the new process was created plus the CPU seconds it used until it answered.
    A process that spends 1.5 s not running (here asleep, as one waiting behind a loaded CPU does) adds nothing."""
    import subprocess
    import sys
    import time

    from infracourse.grading.serving import restart_at_rest

    killed = time.perf_counter()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(1.5)\n"
    proc = subprocess.Popen([sys.executable, "-c", burn + "print('ready', flush=True)\ntime.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        wall = time.perf_counter() - killed
        at_rest = restart_at_rest({"killed": killed, "new": {"pid": proc.pid}})
    finally:
        proc.kill()
        proc.wait()
    assert wall >= 1.8, wall
    assert 0.3 <= at_rest < wall - 1.0, (at_rest, wall)
    assert restart_at_rest({"killed": killed, "new": {"pid": proc.pid}}) is None  # gone: no figure


@pytest.mark.parametrize("edit, says", [
    (lambda data: data.pop("points"), "no sweep points the judge can read"),
    (lambda data: data["points"][0].update(ttft_p99_ms="fast"), "no sweep points the judge can read"),
    (lambda data: data.update(capacity_requests_per_s=12.9), "none of its 6 sweep points was run at that rate"),
    (lambda data: data["points"][4].update(goodput_fraction=0.97), "the claim must be a rate that held"),
    (lambda data: data["points"].pop(5), "no point at most 5 % above"),
])
def test_a_capacity_json_without_its_evidence_fails_naming_the_fix(monkeypatch, tmp_path, edit, says):
    """Issue 29 class 4: the report's at-capacity figures are capacity.json's point at the claim, so the judge
    reads that point (it held) and the miss above it; a file without them fails with the fix, never a crash."""
    from infracourse.failures import LabCheckFailed

    judge = _week21_judge(monkeypatch)
    data = json.loads((SOLUTION / "capacity.json").read_text())
    assert len(data["points"]) == 6 and data["points"][4]["rate"] == pytest.approx(data["capacity_requests_per_s"], rel=1e-4)
    point = judge.capacity_point(type("L", (), {"path": lambda self, name: SOLUTION / name})(),
                                 data["capacity_requests_per_s"])
    assert point is not None and point["goodput_fraction"] >= 0.99
    edit(data)
    (tmp_path / "capacity.json").write_text(json.dumps(data))
    learner = type("L", (), {"path": lambda self, name: tmp_path / name})()
    with pytest.raises(LabCheckFailed) as caught:
        judge.capacity_point(learner, data["capacity_requests_per_s"])
    assert says in str(caught.value) and "capacity.json" in str(caught.value), str(caught.value)


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """gateway.py, diagnose.py, sweep.py, the Dockerfile and k8s/deployment.yaml by someone who read only the
    handout, the starter, lab.yaml and the kit modules it names (tests/fixtures/week21-handout), with the
    capacity.json its sweep.py wrote serving that gateway and its report in its own words."""
    assert_solution_passes(grade_lab, machine, "week21", edits=handout_solution("week21"))
