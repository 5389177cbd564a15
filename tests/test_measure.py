"""`infracourse measure`: the report's figures come from a grade of the checks that measure them, on this
machine, written into the figures block line by line; nothing else in the report changes."""
import pytest
from typer.testing import CliRunner

from infracourse.course import Course
from infracourse.grading.measure import figures_of_grade, measuring_checks, write_figures
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.failures import LabCheckFailed
from infracourse.workspace import Workspace

from conftest import REPO

WEEK13 = Course(REPO).lab("week13").spec
REPORT = "# Report\n\nsome prose: 0.77 stays\n\n```yaml figures\nzero1_comm_share: 0.34\nkept_as_written: 12\n```\n"


def _grade(status="passed", share=0.8123456789, blocked=()):
    def check(check_id, figures=None):
        state = "blocked" if check_id in blocked else status
        return CheckResult(id=check_id, title="t", kind="correctness", needs="cpu", status=state,
                           message="" if state == "passed" else "why", figures=figures or {})
    step = {"zero1 communication share, world 2": {"value": share}, "zero1 step ms, world 2": {"value": 13.0},
            "peak memory mb per rank, world 2": {"value": 379.859}}
    checks = [check(i, step if i == "sharded-step-measured" else None) for i in measuring_checks(WEEK13)]
    return GradeResult(week="week13", tier="cpu", device="cpu", fingerprint="f", started_at="t", seconds=1.0,
                       checks=checks, partial=True)


def test_the_checks_measured_are_those_the_report_figures_name():
    assert measuring_checks(WEEK13) == ["memory-largest-fits", "zero1-state-sharded", "fsdp-matches-ddp",
                                        "checkpoint-saves-less", "sharded-step-measured"]


def test_figures_are_written_into_the_block_only():
    measured = figures_of_grade(WEEK13, _grade())
    assert measured.figures["zero1_comm_share"] == 0.812346 and measured.figures["zero1_step_ms"] == 13
    new = write_figures(REPORT, measured.figures, "report.md")
    assert "zero1_comm_share: 0.812346\n" in new and "kept_as_written: 12\n" in new
    assert "zero1_step_ms: 13\n" in new and new.startswith("# Report\n\nsome prose: 0.77 stays\n")
    assert "zero1_state_bytes_per_rank_world2" not in new  # recorded by no check of this grade: not invented


def test_a_check_that_did_not_pass_or_is_blocked_leaves_its_figure_as_written():
    measured = figures_of_grade(WEEK13, _grade(blocked=("sharded-step-measured",)))
    assert "zero1_comm_share" not in measured.figures
    assert measured.left["zero1_comm_share"].startswith("sharded-step-measured blocked")
    assert write_figures(REPORT, measured.figures, "report.md").count("zero1_comm_share: 0.34") == 1


def test_a_report_without_one_figures_block_is_refused_naming_the_fix():
    with pytest.raises(LabCheckFailed, match="0 figures blocks: keep exactly one"):
        write_figures("# no block\n", {"a": 1}, "report.md")


def test_the_command_grades_the_measuring_checks_and_shows_the_diff(tmp_path, monkeypatch):
    from infracourse import cli

    course = Course(REPO)
    ws = Workspace.init(tmp_path / "ws")
    ws.unlock(course, course.week("week13"))
    asked = []
    monkeypatch.setattr(cli, "_grade", lambda ws, course, w, **options: asked.append(options) or _grade())
    out = CliRunner().invoke(cli.app, ["measure", "week13"], env={"INFRACOURSE_WORKSPACE": str(ws.root)},
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert asked == [{"checks": measuring_checks(WEEK13)}]
    assert "+zero1_comm_share: 0.812346" in out.output
    assert "zero1_comm_share: 0.812346\n" in (ws.root / "week13" / "report.md").read_text()


def test_derived_figures_are_written_from_the_rewritten_block(tmp_path):
    """Week 12's efficiencies are T1 / T2 of the block's own step times: measure writes the timings first, then
    grades figures-follow again on the rewritten block, so the derived figures follow the new timings."""
    from infracourse.grading.measure import derived_checks, measure_report

    week12 = Course(REPO).lab("week12").spec
    assert derived_checks(week12) == ["figures-follow"]
    report = tmp_path / "report.md"
    report.write_text("```yaml figures\nstep_ms: 9\nt1_weak_ms: 3\nweak_efficiency: 0.3333\n```\n")
    calls = []

    def grade_checks(ids):
        calls.append((list(ids), report.read_text()))
        if ids == ["figures-follow"]:  # what the check computes from the block it reads now
            block = dict(line.split(": ") for line in report.read_text().splitlines() if ": " in line)
            figures = {"weak_efficiency from the relation": {"value": float(block["t1_weak_ms"])
                                                                  / float(block["step_ms"])}}
            # it fails (the block still holds the old weak_efficiency) yet records the relation's figure
            checks = [CheckResult(id="figures-follow", title="t", kind="correctness", needs="cpu",
                                  status="failed", message="weak_efficiency = 0.3333, but ...", figures=figures)]
        else:
            figures = {"step ms": {"value": 4.0}, "world 1 weak step ms": {"value": 3.0}}
            checks = [CheckResult(id=i, title="t", kind="correctness", needs="cpu", status="passed",
                                  figures=figures if i == "scaling-measured" else {}) for i in ids]
        return GradeResult(week="week12", tier="cpu", device="cpu", fingerprint="f", started_at="t", seconds=1.0,
                           checks=checks, partial=True)

    old, new, measured = measure_report(week12, report, grade_checks)
    assert calls[1][0] == ["figures-follow"] and "step_ms: 4" in calls[1][1]  # graded on the rewritten block
    assert "weak_efficiency: 0.75\n" in new and report.read_text() == new and old.startswith("```yaml figures\nstep_ms: 9")
    assert measured.figures["weak_efficiency"] == 0.75
