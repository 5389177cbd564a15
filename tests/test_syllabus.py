"""Course files load into validated models; malformed ones fail naming the file, the entry and the fix."""
import json
from pathlib import Path

import pytest

from infracourse.course import Course
from infracourse.schema import json_schema
from infracourse.syllabus import CourseFileError, load_lab, load_syllabus, normalise_week



def test_real_syllabus_has_24_weeks_in_order_with_known_checks(course):
    weeks = course.syllabus.weeks
    assert [w.id for w in weeks] == [f"week{i:02d}" for i in range(1, 25)]
    for week in weeks:
        assert week.objectives and week.hours > 0
        if week.planned:
            continue
        for track in course.tracks if week.on_track else [None]:  # a project week: each track's project
            ids = {c.id for c in course.lab(week, track=track).spec.checks}
            named = {c for _, checks in course.acceptance(week, track=track) for c in checks}
            assert named and named <= ids, (week.id, track, named - ids)


def test_every_track_stages_its_whole_project(course):
    """Weeks 22-24 grade a growing part of one project: week 24 every check, earlier weeks a prefix, the rest
    named in `later` (their grader tests are left out, not failed)."""
    assert set(course.tracks) == {"nvidia", "model-vendor", "platform", "cambricon"}
    for track in course.tracks:
        sizes = []
        for week in ("week22", "week23", "week24"):
            lab = course.lab(week, track=track)
            assert lab.spec.week == week and not set(lab.spec.later) & {c.id for c in lab.spec.checks}
            sizes.append(len(lab.spec.checks))
        assert sizes == sorted(sizes) and course.lab("week24", track=track).spec.later == [], (track, sizes)
        assert {"environment-pinned", "run-command", "project-plan", "bottleneck-evidence", "report"} <= \
            {c.id for c in course.lab("week24", track=track).spec.checks}


@pytest.mark.parametrize("ref", ["week07", "7", "w7", "W07", 7])
def test_week_references(ref):
    assert normalise_week(ref) == "week07"


@pytest.mark.parametrize("ref", ["week25", "0", "seven", ""])
def test_bad_week_references(ref):
    with pytest.raises(KeyError, match="not a week"):
        normalise_week(ref)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "syllabus.yaml"
    path.write_text(text)
    return path


def test_invalid_yaml_names_the_file(tmp_path):
    path = _write(tmp_path, "format_version: 1\nweeks: [\n")
    with pytest.raises(CourseFileError, match=r"syllabus.yaml: not valid YAML"):
        load_syllabus(path)


def test_bad_entry_is_named(tmp_path):
    path = _write(tmp_path, """format_version: 1
title: t
weeks:
  - {id: week01, phase: p, title: a, objectives: [o], hours: 8, lab: planned}
  - {id: week2, phase: p, title: b, objectives: [], hours: 8, lab: planned, colour: red}
""")
    with pytest.raises(CourseFileError) as info:
        load_syllabus(path)
    text = str(info.value)
    assert "syllabus.yaml" in text
    assert "weeks.1.id" in text and "weekNN" in text
    assert "weeks.1.objectives" in text
    assert "weeks.1.colour" in text  # unknown keys are refused, not ignored


def test_weeks_out_of_order_are_refused(tmp_path):
    path = _write(tmp_path, """format_version: 1
title: t
weeks:
  - {id: week02, phase: p, title: a, objectives: [o], hours: 8, lab: planned}
  - {id: week01, phase: p, title: b, objectives: [o], hours: 8, lab: planned}
""")
    with pytest.raises(CourseFileError, match="in order"):
        load_syllabus(path)


def test_lab_yaml_requires_known_requirements_and_hints(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text("""format_version: 1
week: week01
title: t
files: [a.py]
hints: []
checks:
  - {id: perf, title: p, requires: [correct], needs: tpu}
""")
    with pytest.raises(CourseFileError) as info:
        load_lab(path)
    text = str(info.value)
    assert "hints" in text and "needs" in text and "'cpu', 'cuda', 'multi-gpu:N'" in text


def test_missing_lab_folder_is_a_clear_error(tmp_path):
    (tmp_path / "curriculum").mkdir()
    (tmp_path / "curriculum" / "syllabus.yaml").write_text(
        "format_version: 1\ntitle: t\nweeks:\n  - {id: week01, phase: p, title: a, objectives: [o], hours: 8, "
        "lab: week01-gone}\n")
    with pytest.raises(CourseFileError, match=r"week01-gone/lab.yaml: file not found"):
        Course(tmp_path).lab("week01")


def test_schema_covers_every_course_file():
    schema = json_schema()
    assert set(schema) == {"syllabus.yaml", "lab.yaml", "tracks/*.yaml", "drills/*.yaml"}
    assert "weeks" in json.dumps(schema["syllabus.yaml"])


def test_platform_needs_block_with_their_reason_where_nothing_answers(monkeypatch):
    """'docker' and 'k8s' are hardware needs like a GPU: a check that needs them is blocked, saying which and why,
    where no container engine or cluster answers (a client binary alone is not enough)."""
    from infracourse import hardware

    hw = hardware.detect()
    detectors = hardware.kubernetes_cluster.__wrapped__, hardware.container_engine.__wrapped__  # uncached
    monkeypatch.setattr(hardware, "container_engine", lambda: None)
    monkeypatch.setattr(hardware, "kubernetes_cluster", lambda: None)
    assert not hw.satisfies("docker") and "container engine" in hw.missing("docker")
    assert not hw.satisfies("k8s") and "Kubernetes cluster" in hw.missing("k8s")
    monkeypatch.setattr(hardware, "container_engine", lambda: "podman")
    assert hw.satisfies("docker") and hw.missing("docker") == ""
    monkeypatch.setattr(hardware, "_answers", lambda command, timeout_s=10: False)  # no daemon, no cluster
    assert [detect() for detect in detectors] == [None, None]
