"""The engine's side of weeks 22-24 and of 003 §8-§11, without grading a project: choosing a track, the project
folder, the generic project block and lock checks, the estimate helpers, `doctor --plan`, the completion criteria
and their certificate (the tracks' own graders are proven in tests/test_track_*.py)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from infracourse.completion import MET, MET_TO_VERIFY, NOT_MET, certificate, completion, verify_certificate
from infracourse.course import Course, NoTrackChosen
from infracourse.grading.estimate import check_formula, check_measured
from infracourse.grading.project import parse_data, parse_evidence
from infracourse.grading.project_files import check_lock, pin_lock, read_project
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.failures import LabCheckFailed, WrongOutput
from infracourse.hardware import detect
from infracourse.plan import plan, rent_total
from infracourse.workspace import Workspace


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "infracourse", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})


def test_a_project_week_needs_a_track_and_opens_in_project(tmp_path):
    ws = Workspace.init(tmp_path / "ws")
    course = Course(REPO, track=ws.track)
    week = course.week("week22")
    with pytest.raises(NoTrackChosen, match="infracourse track choose"):
        ws.unlock(course, week)
    assert "week22" not in ws.progress.unlocked()  # a refused unlock records nothing
    ws.choose_track(course, "platform")
    assert Workspace(ws.root).track == "platform"
    report = ws.unlock(course, week)
    assert report.folder == ws.root / "project" and (ws.root / "project" / "report.md").exists()
    assert ws.week_here(ws.root / "project") == "week22"
    ws.unlock(course, course.week("week23"))
    assert ws.week_here(ws.root / "project") == "week23"  # inside project/: the latest project week


def test_changing_track_moves_the_started_project_aside(tmp_path):
    ws = Workspace.init(tmp_path / "ws")
    course = Course(REPO)
    ws.choose_track(course, "platform")
    ws.unlock(course, course.week("week22"))
    (ws.root / "project" / "notes.txt").write_text("mine")
    moved = ws.choose_track(course, "model-vendor")
    assert moved == ws.root / "project-platform" and (moved / "notes.txt").read_text() == "mine"
    assert not (ws.root / "project").exists() and course.track_id == "model-vendor"
    with pytest.raises(Exception, match="no track 'gpu-magic'"):
        ws.choose_track(course, "gpu-magic")


def test_track_commands(tmp_path):
    assert cli("init", "ws", cwd=tmp_path).returncode == 0
    ws = tmp_path / "ws"
    listed = cli("track", "list", cwd=ws)
    assert listed.returncode == 0 and all(t in listed.stdout for t in ("nvidia", "model-vendor", "platform", "cambricon"))
    refused = cli("unlock", "week22", cwd=ws)
    assert refused.returncode == 2 and "track choose" in refused.stderr and "Traceback" not in refused.stderr
    assert cli("track", "choose", "nope", cwd=ws).returncode == 2
    chosen = cli("track", "choose", "platform", cwd=ws)
    assert chosen.returncode == 0, chosen.stderr
    assert "(chosen)" in cli("track", "list", cwd=ws).stdout
    assert cli("unlock", "week22", cwd=ws).returncode == 0 and (ws / "project" / "gateway.py").exists()


PROJECT = """## Run command
```yaml project
run: python run.py --out raw
lock: requirements.lock
raw_data: [raw/baseline.json]
evidence: [raw/trace.json]
failure_cases: [raw/failure.csv]
to_be_verified: [nccl-expert-parallel]
```
"""


def test_project_block_is_read_and_malformed_blocks_say_the_fix():
    project = read_project(PROJECT, "report.md")
    assert project.run == ["python", "run.py", "--out", "raw"] and project.to_be_verified == ["nccl-expert-parallel"]
    with pytest.raises(LabCheckFailed, match="no ```yaml project block"):
        read_project("## Run command\nnothing\n", "report.md")
    with pytest.raises(LabCheckFailed, match="python SCRIPT.py ARGS"):
        read_project(PROJECT.replace("python run.py --out raw", "bash run.sh"), "report.md")
    with pytest.raises(LabCheckFailed, match="inside the project"):
        read_project(PROJECT.replace("raw/baseline.json", "../../etc/passwd.json"), "report.md")


def test_lock_must_pin_what_is_installed(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("# pins\ntorch==0.1\nnumpy==0.1\n")
    with pytest.raises(LabCheckFailed, match="does not describe the environment that ran: torch==0.1"):
        check_lock(lock)
    pin_lock(lock)  # what `infracourse report` does on the machine that measures
    assert check_lock(lock).keys() == {"torch", "numpy"} and lock.read_text().startswith("# pins\n")
    lock.write_text("torch\nnumpy==1\n")
    with pytest.raises(LabCheckFailed, match="does not pin one version"):
        check_lock(lock)
    lock.write_text("numpy==1\n")
    with pytest.raises(LabCheckFailed, match="pins no"):
        check_lock(lock)


def test_raw_data_and_evidence_are_parsed_as_files(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n3,4\n")
    (tmp_path / "b.json").write_text("[]")
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "mm", "dur": 3.0}]}))
    (tmp_path / "table.json").write_text(json.dumps({"rows": [{"name": "a", "self_ms": 1}]}))
    assert parse_data(tmp_path / "a.csv") == 2
    with pytest.raises(LabCheckFailed, match="holds no records"):
        parse_data(tmp_path / "b.json")
    assert parse_evidence(tmp_path / "trace.json") == ("trace", 1)
    with pytest.raises(LabCheckFailed, match="at least two rows"):
        parse_evidence(tmp_path / "table.json")


def test_estimate_checks_the_formula_then_the_measurement():
    def kv_bytes(layers, heads, head_dim, tokens, dtype_bytes):
        return 2 * layers * heads * head_dim * tokens * dtype_bytes

    cases = [dict(layers=2, heads=4, head_dim=16, tokens=t, dtype_bytes=b) for t in (1, 7) for b in (2, 4)]
    assert check_formula("kv_bytes", kv_bytes, kv_bytes, cases)[0] == 512
    with pytest.raises(WrongOutput, match=r"kv_bytes\(layers=2.*the formula gives"):
        check_formula("kv_bytes", lambda **k: kv_bytes(**k) // 2, kv_bytes, cases)  # forgot V
    with pytest.raises(WrongOutput, match="finite number"):
        check_formula("kv_bytes", lambda **k: float("nan"), kv_bytes, cases)
    assert check_measured("kv", 1000, 1100, 1.2) == pytest.approx(1.1)
    with pytest.raises(LabCheckFailed, match="differ by more than 1.2x"):
        check_measured("kv", 1000, 1500, 1.2)


def test_plan_lists_what_runs_what_is_blocked_and_what_to_rent():
    hw = detect()
    if hw.gpu_count:
        pytest.skip("the plan of a CPU machine")
    rows = {r.week: r for r in plan(Course(REPO, track="nvidia"), hw)}
    assert rows["week09"].rent is not None and any(c == "cublas-4096" for c, _ in rows["week09"].blocked)
    assert rows["week03"].rent is None and not rows["week03"].blocked  # runs whole on a CPU
    assert rows["week21"].rent is None and {c for c, _ in rows["week21"].blocked} == {"image-build", "k8s-deployment"}
    assert rows["week23"].rent.memory_gib == Course(REPO).track("nvidia").gpu.memory_gib
    assert rent_total(list(rows.values()))[2] > 0  # weeks 11-14 ask for 2-GPU machines
    no_track = {r.week: r for r in plan(Course(REPO), hw, done={"week01"})}
    assert "week01" not in no_track and "track" in no_track["week22"].note
    shown = cli("doctor", "--plan", cwd=REPO)
    assert shown.returncode == 0 and "to rent" in shown.stdout


def test_multi_node_and_mlu_needs_block_with_their_reason():
    hw = detect()
    assert not hw.satisfies("mlu") and "to be verified on an MLU" in hw.missing("mlu")
    assert not hw.satisfies("multi-node") and "several machines" in hw.missing("multi-node")


def _result(week: str, statuses: dict[str, str]) -> GradeResult:
    checks = [CheckResult(c, c, "correctness", "cpu", s, "") for c, s in statuses.items()]
    return GradeResult(week=week, tier="cpu", device="cpu", fingerprint="f", started_at="2026-12-03T10:00:00",
                       seconds=1.0, checks=checks)


def test_completion_criteria_from_grades_and_a_certificate_an_instructor_can_verify():
    course = Course(REPO, track="platform")
    entries = [e for c in course.syllabus.completion for e in c.checks]
    assert len(course.syllabus.completion) == 6
    for entry in entries:  # every criterion is backed by checks that exist (project weeks: every track has them)
        week, check = entry.split(":")
        for track in (course.tracks if course.week(week).on_track else [None]):
            assert check in {c.id for c in course.lab(week, track=track).spec.checks}, (entry, track)
    weeks = sorted({e.split(":")[0] for e in entries})
    all_passed = {w: _result(w, {e.split(":")[1]: "passed" for e in entries if e.startswith(w)}) for w in weeks}
    assert {s.state for s in completion(course, all_passed)} == {MET}
    week06 = {e.split(":")[1]: "passed" for e in entries if e.startswith("week06")} | {"memory-gpu-peak": "blocked"}
    blocked = dict(all_passed, week06=_result("week06", week06))
    states = {s.id: s.state for s in completion(course, blocked)}
    assert states["estimate-and-explain"] == MET_TO_VERIFY and states["end-to-end-path"] == MET
    missing = {w: r for w, r in all_passed.items() if w != "week24"}
    assert {s.state for s in completion(course, missing)} == {NOT_MET, MET}

    cert = certificate(course, blocked, learner="ada", track="platform")
    assert cert["complete"] and cert["to_be_verified"] == ["week06:memory-gpu-peak"]
    assert verify_certificate(cert, course, blocked) == []
    regraded = dict(blocked, week09=_result("week09", {"roofline": "failed", "shape-sweep": "passed"}))
    problems = verify_certificate(cert, course, regraded)
    assert any("week09:roofline" in p for p in problems)
    assert verify_certificate({"kind": "something"}, course, blocked)


def test_status_completion_writes_the_certificate(tmp_path):
    assert cli("init", "ws", cwd=tmp_path).returncode == 0
    shown = cli("status", "--completion", "--certificate", str(tmp_path / "cert"), cwd=tmp_path / "ws")
    assert shown.returncode == 0, shown.stderr
    cert = json.loads((tmp_path / "cert" / "completion.json").read_text())
    assert not cert["complete"] and len(cert["criteria"]) == 6
    page = (tmp_path / "cert" / "completion.html").read_text()
    assert "not met" in page and "<script" not in page


def test_every_staged_project_week_survives_the_judges_round_trip():
    """The runner hands the judge the staged lab (week22-24 of a track, its rubric items naming their week) as
    JSON, which the judge validates again: a staged week that fails that validation errs every check."""
    from infracourse.course import Course
    from infracourse.syllabus import PROJECT_WEEKS, Lab

    course = Course()
    for track in course.tracks:
        for week in PROJECT_WEEKS:
            staged = course.lab(week, track=track).spec
            assert Lab.model_validate_json(staged.model_dump_json()) == staged
