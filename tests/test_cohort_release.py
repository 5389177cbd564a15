"""`infracourse release`: the learner copy holds no reference solution, under any name, and still works."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from infracourse.cohort.release import MARKER, ReleaseError, check_release, release
from infracourse.course import Course
from infracourse.workspace import Workspace

from conftest import REPO

WEEK07 = "labs/week07-triton-basics"


def _solution_hashes(root):
    """sha256 of every solution file whose bytes its starter does not share."""
    (root / WEEK07 / "solution" / "vector_ops.py").stat()  # in a learner release: FileNotFoundError, a skip
    hashes = {}
    for lab in sorted((root / "labs").iterdir()):
        for path in sorted((lab / "solution").rglob("*")):
            starter = lab / "starter" / path.relative_to(lab / "solution")
            if path.is_file() and not (starter.is_file() and starter.read_bytes() == path.read_bytes()):
                hashes[hashlib.sha256(path.read_bytes()).hexdigest()] = path
    return hashes


def test_release_of_this_repository_has_no_solution_and_works(tmp_path):
    secret = _solution_hashes(REPO)
    out = release(REPO, tmp_path / "learner").out
    assert not list(out.glob("labs/*/solution")) and not list(out.glob("labs/*/*/solution"))
    shipped = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in shipped if hashlib.sha256(p.read_bytes()).hexdigest() in secret]
    assert check_release(out, REPO) == []
    removed = {r["path"]: r["reason"] for r in json.loads((out / MARKER).read_text())["removed"]}
    assert f"{WEEK07}/solution/vector_ops.py" in removed
    assert removed["tests/test_week07.py"].startswith(f"quotes {WEEK07}/solution/vector_ops.py")
    assert (out / WEEK07 / "starter" / "vector_ops.py").is_file() and (out / "graders" / "week07").is_dir()
    # the honest solutions the lab proofs grade are whole answers too: none ships, each is listed
    honest = [p for p in (REPO / "tests").rglob("*.py") if "honest" in p.relative_to(REPO / "tests").parts[:-1]
              or any(part.endswith("-honest") for part in p.relative_to(REPO / "tests").parts[:-1])]
    assert honest, "the lab proofs grade honest solutions under tests/fixtures"
    for path in honest:
        rel = path.relative_to(REPO).as_posix()
        assert not (out / rel).exists() and removed[rel].startswith("an honest solution"), rel
    assert (out / "pyproject.toml").is_file() and (out / "README.md").is_file()

    # the learner's first command: a workspace from the release unlocks week 7 from its starter
    ws = Workspace.init(tmp_path / "ws")
    report = ws.unlock(Course(out), Course(out).week("week07"))
    assert "vector_ops.py" in report.copied
    # the second: the release's own test suite runs, skipping what needs a solution and saying why
    (out / "tests" / "test_probe_release.py").write_text(
        "import pytest\n\nfrom conftest import REPO\n\n\n"
        "def test_needs_a_solution():\n"
        f"    (REPO / '{WEEK07}' / 'solution' / 'vector_ops.py').read_text()\n\n\n"
        "@pytest.mark.solutions\n"
        "def test_marked_as_needing_solutions():\n"
        "    assert False\n\n\n"
        "def test_fails_for_another_reason():\n"
        "    open('/nonexistent/file')\n")
    env = {**os.environ, "PYTHONPATH": str(out / "src")}
    env.pop("INFRACOURSE_COURSE", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "tests/test_probe_release.py"], cwd=out, env=env, capture_output=True, text=True)
    assert "1 failed, 2 skipped" in run.stdout, run.stdout + run.stderr
    assert "learner release does not ship" in run.stdout
    collected = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
                               cwd=out, env=env, capture_output=True, text=True)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert "test_week07.py" not in collected.stdout


@pytest.fixture
def course_copy(tmp_path):
    """A course folder outside git (release walks it) with the real week 7."""
    (REPO / WEEK07 / "solution" / "vector_ops.py").stat()  # in a learner release: FileNotFoundError, a skip
    root = tmp_path / "course"
    for part in ("curriculum", WEEK07, "graders/week07"):
        shutil.copytree(REPO / part, root / part)
    return root


def test_solution_content_under_another_name_stops_the_release(course_copy, tmp_path):
    solution = (course_copy / WEEK07 / "solution" / "vector_ops.py").read_text()
    (course_copy / WEEK07 / "starter" / "vector_ops_done.py").write_text(solution)
    with pytest.raises(ReleaseError, match=r"vector_ops_done.py: the same bytes as .*solution/vector_ops.py"):
        release(course_copy, tmp_path / "out")
    assert not (tmp_path / "out").exists(), "no half-made release"
    (course_copy / WEEK07 / "starter" / "vector_ops_done.py").unlink()
    line = next(l.strip() for l in solution.splitlines() if "tl.store(out_ptr" in l)
    (course_copy / "docs").mkdir()
    (course_copy / "docs" / "cheatsheet.md").write_text(f"The answer:\n\n    {line}\n")
    with pytest.raises(ReleaseError, match=r"docs/cheatsheet.md: quotes .*solution/vector_ops.py: 'tl.store"):
        release(course_copy, tmp_path / "out")


def test_a_test_that_quotes_a_solution_is_left_out_and_listed(course_copy, tmp_path):
    solution = (course_copy / WEEK07 / "solution" / "vector_ops.py").read_text()
    (course_copy / "tests").mkdir()
    (course_copy / "tests" / "test_proof.py").write_text(f"SOLUTION = {solution!r}\n")
    (course_copy / "tests" / "test_plain.py").write_text("def test_nothing():\n    pass\n")
    report = release(course_copy, tmp_path / "out")
    assert [r["path"] for r in report.removed if r["path"].startswith("tests/")] == ["tests/test_proof.py"]
    assert (report.out / "tests" / "test_plain.py").is_file() and not (report.out / "tests" / "test_proof.py").exists()


def test_release_refuses_a_used_or_nested_folder(course_copy, tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    with pytest.raises(ReleaseError, match="used exists and is not empty"):
        release(course_copy, tmp_path / "used")
    with pytest.raises(ReleaseError, match="inside the course folder"):
        release(course_copy, course_copy / "release")


def test_a_solution_line_is_found_wherever_a_text_holds_it():
    """The one-pass search (lines looked up by their first 32 characters) finds what `line in text` finds: a line
    inside a longer one, two lines that share their first 32 characters, a line that ends the text; none else."""
    from infracourse.cohort.release import _by_prefix, _quoted

    short = "out = tl.load(x_ptr + offsets, mask=offsets < n)"
    longer = short + ".to(tl.float32)"  # the same first 32 characters
    other = "partial = tl.sum(values, axis=0) * scale_of_block"
    absent = "tl.store(out_ptr + offsets, result, mask=offsets < n)"
    lines = [short, longer, other, absent]
    for text in (f"    y = {longer}  # inline", f"header\n{other}", f"{short[:-1]}\n{other[1:]}", other, ""):
        assert _quoted(text, _by_prefix(lines)) == {line for line in lines if line in text}, text
