"""Submission bundles: `submit` writes what `read_bundle` accepts, and every kind of bad bundle is refused
with a reason that names the file and what to do."""
import json
import os
import stat
import zipfile
from dataclasses import asdict

import pytest

from infracourse import __version__
from infracourse.cohort import synthetic
from infracourse.cohort.bundle import BundleError, Manifest, graders_digest, read_bundle, submit
from infracourse.course import Course
from infracourse.hardware import calibration_path
from infracourse.workspace import Workspace

from cohort_support import members, rezip
from conftest import REPO
from minicourse import FIXTURE as FIXTURE_COURSE

GPU, GPU_CEILINGS = synthetic.DEVICES[1]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return synthetic.write_course(tmp_path_factory.mktemp("course"), weeks=3, kernel_weeks=(2,))


@pytest.fixture
def graded(course, tmp_path):
    """A workspace with week02 unlocked, solved and graded (the grade as a GPU machine would report it)."""
    ws = Workspace.init(tmp_path / "ws")
    lab = course.lab("week02")
    ws.unlock(course, course.week("week02"))
    (ws.root / "week02" / "answer.py").write_text(synthetic.SOLUTION)
    (ws.root / "week02" / "__pycache__").mkdir()
    (ws.root / "week02" / "__pycache__" / "answer.cpython-311.pyc").write_bytes(b"cache")
    ws.progress.record(synthetic.result_for(lab, GPU, GPU_CEILINGS, solved=True, share=0.8,
                                            started_at="2026-02-01T10:00:00"))
    return ws


@pytest.fixture
def good(course, tmp_path):
    return synthetic.write_cohort(course, tmp_path / "bundles", learners=1, missing=0)[1]  # week02


def test_submit_writes_files_results_environment_and_hashes(course, graded, tmp_path, monkeypatch):
    monkeypatch.setenv("INFRACOURSE_CACHE", str(tmp_path / "cache"))
    calibration_path(GPU).parent.mkdir(parents=True)
    calibration_path(GPU).write_text(json.dumps(asdict(GPU_CEILINGS)))
    path = submit(graded, course, "2", learner="ada@uni.example", hardware=GPU)
    assert path.parent == graded.root / "submissions" and path.name.startswith("week02-") and path.suffix == ".zip"
    assert sorted(members(path)) == ["files/README.md", "files/answer.py", "manifest.json", "results.json"]
    bundle = read_bundle(path, course)
    m = bundle.manifest
    assert (m.learner, m.week, m.infracourse_version) == ("ada@uni.example", "week02", __version__)
    assert m.graders_sha256 == graders_digest(course.lab("week02"))
    assert m.environment["gpu_name"] == GPU.gpu_name and m.environment["driver"] == GPU.driver
    assert m.environment["cuda"] and m.environment["torch"] and m.environment["triton"]
    assert m.ceilings["copy_gbps"] == GPU_CEILINGS.copy_gbps
    assert bundle.files["answer.py"] == synthetic.SOLUTION.encode()
    assert bundle.results.complete and bundle.results.week == "week02"
    assert submit(graded, course, "week02", learner="ada@uni.example", hardware=GPU) != path, "never overwritten"


def test_submit_takes_the_learner_from_the_workspace_config(course, graded):
    config = graded.meta / "config.yaml"
    config.write_text(config.read_text() + "learner: grace\n")
    assert read_bundle(submit(graded, course, "w2", hardware=GPU), course).manifest.learner == "grace"


def test_submit_says_what_is_missing(course, graded):
    with pytest.raises(BundleError, match=r"config.yaml: no learner id: pass `--learner ID`"):
        submit(graded, course, "week02", hardware=GPU)
    with pytest.raises(BundleError, match="week01 has no grade yet: run `infracourse grade week01` first"):
        submit(graded, course, "week01", learner="ada", hardware=GPU)
    (graded.root / "week02" / "answer.py").unlink()
    with pytest.raises(BundleError, match=r"answer.py missing: `infracourse reset week02` restores"):
        submit(graded, course, "week02", learner="ada", hardware=GPU)


def _manifest(good, **changes):
    files = members(good)
    manifest = json.loads(files["manifest.json"])
    for key, value in changes.items():
        if value is None:
            manifest.pop(key)
        else:
            manifest[key] = value
    return {**files, "manifest.json": json.dumps(manifest).encode()}


def _symlink(path, good):
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as zf:
        for name in src.namelist():
            zf.writestr(name, src.read(name))
        link = zipfile.ZipInfo("files/secret.py")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
    return path


def _too_many(path, good):
    files = members(good)
    return rezip(path, {**files, **{f"files/f{i}.txt": b"x" for i in range(1001)}})


def _bomb(path, good):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members(good).items():
            zf.writestr(name, data)
        zf.writestr("files/data.bin", bytes(65 * 2**20))  # 65 MiB of zeros packs into ~65 KiB
    return path


def _huge(path, good):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("files/data.bin", os.urandom(17 * 2**20))
    return path


def _write(path, data):
    path.write_bytes(data)
    return path


def _week_bytes(good, week):
    files = members(good)
    results = json.loads(files["results.json"])
    results["week"] = week
    return {**files, "results.json": json.dumps(results).encode()}


MALFORMED = {
    # name: (make(path, good) -> path, kind, what the message must say)
    "not a zip": (lambda p, g: _write(p, b"this is a report, not a zip"), "not-zip", "not a readable zip"),
    "truncated zip": (lambda p, g: _write(p, g.read_bytes()[:300]), "not-zip", "not a readable zip"),
    "parent path": (lambda p, g: rezip(p, {**members(g), "../evil.py": b"x"}), "traversal", "'../evil.py'"),
    "absolute path": (lambda p, g: rezip(p, {**members(g), "/etc/cron.d/x": b"x"}), "traversal", "absolute path"),
    "backslash path": (lambda p, g: rezip(p, {**members(g), "files\\..\\..\\x": b"x"}), "traversal", "backslash"),
    "symlink": (_symlink, "traversal", "link"),
    "oversize file": (_huge, "oversize", "over the 16 MiB limit"),
    "zip bomb": (_bomb, "oversize", "over the 64 MiB limit"),
    "too many members": (_too_many, "oversize", "over the limit of 1000"),
    "missing manifest": (lambda p, g: rezip(p, {n: b for n, b in members(g).items() if n != "manifest.json"}),
                         "manifest", "no manifest.json in the zip"),
    "manifest not json": (lambda p, g: rezip(p, {**members(g), "manifest.json": b"{learner: ada"}), "manifest",
                          "manifest.json is malformed"),
    "manifest lacks learner": (lambda p, g: rezip(p, _manifest(g, learner=None)), "manifest", "learner: Field required"),
    "manifest from the future": (lambda p, g: rezip(p, _manifest(g, format_version=3)), "manifest", "format_version"),
    "learner id with a slash": (lambda p, g: rezip(p, _manifest(g, learner="../ada")), "manifest", "learner"),
    "changed file": (lambda p, g: rezip(p, {**members(g), "files/answer.py": b"def answer():\n    return 41\n"}),
                     "hash", "files/answer.py does not match its sha256"),
    "added file": (lambda p, g: rezip(p, {**members(g), "files/extra.py": b""}), "hash", "not listed"),
    "removed file": (lambda p, g: rezip(p, {n: b for n, b in members(g).items() if n != "files/answer.py"}), "hash",
                     "the zip lacks them"),
    "week not in the syllabus": (lambda p, g: rezip(p, _manifest(g, week="week20")), "unknown-week",
                                 "'week20' has no lab in this course"),
    "results of another week": (lambda p, g: rezip(p, _week_bytes(g, "week01"), rehash=True), "manifest",
                                "results.json grades week01 but manifest.json says week02"),
    "results with a made-up status": (
        lambda p, g: rezip(p, {**members(g), "results.json": members(g)["results.json"].replace(
            b'"passed"', b'"excellent"')}, rehash=True), "manifest", "results.json is not a grade result"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_bundle_is_refused_naming_file_and_fix(case, course, good, tmp_path):
    make, kind, says = MALFORMED[case]
    bad = make(tmp_path / "bad.zip", good)
    with pytest.raises(BundleError) as caught:
        read_bundle(bad, course)
    assert caught.value.kind == kind, (case, str(caught.value))
    assert says in str(caught.value), (case, str(caught.value))
    assert str(caught.value).startswith(str(bad)), "the message names the file"
    fix = "INFRACOURSE_COURSE" if kind == "unknown-week" else "infracourse submit"
    assert fix in str(caught.value), ("the message says what to do", str(caught.value))


def test_planned_week_is_unknown_to_the_course(good, tmp_path):
    bad = rezip(tmp_path / "planned.zip", _manifest(good, week="week02"))  # every week of the course is built
    with pytest.raises(BundleError, match="week02 is planned: its lab is not built") as caught:
        read_bundle(bad, Course(FIXTURE_COURSE))
    assert caught.value.kind == "unknown-week"


def test_project_week_without_a_track_is_refused(good, tmp_path):
    bad = rezip(tmp_path / "no-track.zip", _manifest(good, week="week22"))
    with pytest.raises(BundleError, match="week22 is a week of the direction project but manifest.json names no "
                       "track") as caught:
        read_bundle(bad, Course(REPO))
    assert caught.value.kind == "track" and "infracourse track choose" in str(caught.value)
    unknown = rezip(tmp_path / "unknown-track.zip", _manifest(good, week="week22", track="quantum"))
    with pytest.raises(BundleError, match="names track 'quantum', which this course does not have"):
        read_bundle(unknown, Course(REPO))
    stray = rezip(tmp_path / "stray-track.zip", _manifest(good, track="platform"))
    with pytest.raises(BundleError, match="not a project week"):
        read_bundle(stray, Course(REPO))


def test_a_bundle_of_weeks_1_to_21_reads_and_signs_as_before_the_track_field(good):
    """No `track` key in its manifest, its signature and its id: bundles and gradebooks made before the
    tracks stay valid (same signature, same duplicate detection)."""
    manifest = json.loads(members(good)["manifest.json"])
    assert "track" not in manifest
    m = Manifest.model_validate(manifest)
    assert m.track is None and b"track" not in m.signed_bytes() and "track" not in m.canonical()


def test_missing_bundle_file_names_it(course, tmp_path):
    with pytest.raises(BundleError, match=r"nowhere\.zip: cannot be read \(No such file"):
        read_bundle(tmp_path / "nowhere.zip", course)


def test_workspace_config_that_is_not_yaml_is_named(course, graded):
    (graded.meta / "config.yaml").write_text("learner: [unclosed\n")
    with pytest.raises(BundleError, match=r"config.yaml: not valid YAML \(line 2: .*\); fix it or pass --learner"):
        submit(graded, course, "week02", hardware=GPU)


def test_an_executable_file_stays_executable_through_bundle_and_regrade(course, graded, monkeypatch):
    """A week whose deployment runs `./run.sh` was marked failed by the instructor's regrade of a reference
    that passed its own grade: the bundle stored every file as 644, so run.sh lost its executable bit."""
    from infracourse.cohort import outcome

    folder = graded.root / "week02"
    (folder / "run.sh").write_text("#!/bin/sh\necho ready\n")
    (folder / "run.sh").chmod(0o755)
    path = submit(graded, course, "2", learner="ada@uni.example", hardware=GPU)
    bundle = read_bundle(path, course)
    assert bundle.executable == {"run.sh"}
    seen = {}

    def grade(course_, lab, learner_folder, **kwargs):
        seen.update({p.name: p.stat().st_mode & 0o777 for p in learner_folder.iterdir()})
        return bundle.results

    monkeypatch.setattr(outcome, "grade", grade)
    outcome.grade_submission(course, 1, "week02", path.read_bytes, hardware=GPU)
    assert seen["run.sh"] == 0o755 and seen["answer.py"] & 0o111 == 0, seen
