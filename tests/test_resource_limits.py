"""Resource abuse must not reach the trusted side (issue 27, item 5): a flood of output is cut and never read
whole by the judge, a grade leaves no scratch behind however it ends, a learner's markup or terminal escapes
are shown as text, and `submit` sends only regular files of the week folder."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console
from typer.testing import CliRunner

from infracourse.cohort import regrade, synthetic
from infracourse.cohort.bundle import BundleError, submit
from infracourse.cohort.gradebook import Gradebook, Submission
from infracourse.launch import output
from infracourse.grading.confined import run_script
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.grading.runner import grade
from infracourse.workspace import Workspace
from infracourse import views

from cohort_support import members, publish_with_learner_text, rezip
from minicourse import make_course

CONTROLS = ("\x1b", "\r", "\x07", "\x9b", "\u202e")
HOSTILE_TEXT = "[/]ada[bold]\x1b]0;pwned\x07\x1b[2J\rforged\u202e!"


@pytest.fixture
def own_tmp(tmp_path, monkeypatch) -> Path:
    """A temp dir of its own for this test and every process it starts, to see what a grade leaves in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _course(root: Path, check: str, timeout_s: int, call: str):
    return make_course(root, f"  - {{id: {check}, title: \"{check}\", timeout_s: {timeout_s}}}\n"
                             "  - {id: answers, title: \"answer() is 42\"}\n",
                       "import pytest\n\n\n@pytest.fixture(scope='module')\ndef probe(learner):\n"
                       "    return learner.module('probe')\n\n\n"
                       f"@pytest.mark.check('{check}')\ndef test_it(probe):\n    probe.{call}()\n\n\n"
                       "@pytest.mark.check('answers')\ndef test_answers(probe):\n    assert probe.answer() == 42\n",
                       check)


def _learner(tmp_path: Path, source: str) -> Path:
    folder = tmp_path / "learner"
    folder.mkdir()
    (folder / "probe.py").write_text("import os, signal, time\n\n\ndef answer():\n    return 42\n\n\n" + source)
    return folder


class Peaks:
    """Samples, while a grade runs, the judge's resident memory and the largest log file in `folder`."""

    def __init__(self, folder: Path):
        self.folder, self.judge_rss, self.log_bytes = folder, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample(self):
        me = psutil.Process()
        while not self._stop.wait(0.02):
            for child in me.children(recursive=True):
                try:
                    # a fresh judge, or one forked from the warm interpreter (grading.judges), which keeps its line
                    if {"infracourse.grading.plugin", "infracourse.grading.judges"} & set(child.cmdline()):
                        self.judge_rss = max(self.judge_rss, child.memory_info().rss)
                except psutil.Error:
                    continue
            for log in self.folder.rglob("*.log"):
                try:
                    self.log_bytes = max(self.log_bytes, log.stat().st_size)
                except OSError:
                    continue


def test_a_gigabyte_of_output_is_cut_and_never_read_whole(tmp_path, own_tmp, machine):
    """The learner writes 1 GiB in 1 MiB chunks and then dies: the judge used to read the whole log to quote
    its tail (4.4 GB of memory). Now the log stops at the limit, the worker is stopped there, its check is an
    error that says why, and the next check runs in a fresh worker."""
    course = _course(tmp_path / "course", "floods", 120, "flood")
    folder = _learner(tmp_path, "def flood():\n    chunk = b'x' * (2**20 - 1) + b'\\n'\n"
                                "    for _ in range(1024):\n        os.write(1, chunk)\n"
                                "    os.kill(os.getpid(), signal.SIGKILL)\n")
    started = time.perf_counter()
    with Peaks(own_tmp) as peaks:
        result = grade(course, "week01", folder, hardware=machine)
    checks = {c.id: c for c in result.checks}
    assert checks["floods"].status == "error", checks["floods"]
    assert f"cut at {output.OUTPUT_LIMIT // 2**20} MiB" in checks["floods"].message
    assert "print less" in checks["floods"].message
    assert checks["answers"].status == "passed", checks["answers"].message
    assert 0 < peaks.judge_rss < 1.5 * 2**30, f"the judge reached {peaks.judge_rss / 2**20:.0f} MiB"
    assert peaks.log_bytes <= output.OUTPUT_LIMIT, f"a log reached {peaks.log_bytes / 2**20:.0f} MiB"
    assert time.perf_counter() - started < 90


def test_read_tail_reads_only_the_end(tmp_path):
    log = tmp_path / "big.log"
    with open(log, "wb") as f:
        f.truncate(8 * 2**30)  # sparse: 8 GiB that no one could read whole in this test's time
        f.seek(0, os.SEEK_END)
        f.write(b"\nthe last line\n")
    assert output.read_tail(log).endswith("the last line\n")
    assert len(output.read_tail(log)) == output.TAIL_BYTES
    assert output.last_lines("a\n" + "y" * 10_000, 3, max_chars=100) == "y" * 100
    assert output.read_tail(tmp_path / "missing.log") == ""


def test_a_script_that_floods_is_cut_and_its_check_says_why(tmp_path):
    """The confined programs the judge runs (grading.confined) go through the same capture."""
    snapshot = tmp_path / "learner"
    snapshot.mkdir()
    (snapshot / "flood.py").write_text("import os\nfor _ in range(1024):\n    os.write(1, b'y' * 2**20)\n")
    (tmp_path / "scratch").mkdir()
    run = run_script(snapshot, "flood.py", [], scratch=tmp_path / "scratch", timeout_s=120)
    assert run.output_cut and len(run.output) <= output.TAIL_BYTES
    assert f"cut at {output.OUTPUT_LIMIT // 2**20} MiB" in run.failure(120)
    assert (tmp_path / "scratch.script.log").stat().st_size == output.OUTPUT_LIMIT


def test_capture_keeps_draining_when_the_kill_cannot_stop_the_writer(tmp_path):
    """A writer outside the killed session (here: started in the test's own) still never blocks on a full pipe,
    and the log never grows past the limit."""
    captured = output.Capture(tmp_path / "out.log", limit=2**20)
    proc = captured.spawn(lambda fd: subprocess.Popen(
        [sys.executable, "-c", "import os\nfor _ in range(64):\n    os.write(1, b'z' * 2**20)\nprint('end')"],
        stdout=fd, stderr=subprocess.STDOUT, start_new_session=False))
    assert proc.wait(timeout=60) in (0, -signal.SIGKILL)
    captured.finish()
    assert captured.cut and (tmp_path / "out.log").stat().st_size == 2**20


def test_reading_stdout_line_by_line_is_bounded_too(tmp_path):
    """A judge that acts on each line as it arrives (week 5's kill at a step, week 19's clocked lines) reads a
    line of any length in pieces, and kills the writer past the limit."""
    proc = subprocess.Popen([sys.executable, "-c", "import os\nos.write(1, b'a' * 2**20 + b'\\nok\\n')\n"
                             "while True:\n    os.write(1, b'b' * 2**20)\n"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    with pytest.raises(output.OutputCut, match="cut at"):
        for text in output.lines(proc, limit=4 * 2**20):
            seen.append(len(text))
    assert max(seen) <= output.TAIL_BYTES and sum(seen) <= 4 * 2**20
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_scratch_is_removed_after_a_timeout(tmp_path, own_tmp, machine):
    course = _course(tmp_path / "course", "hangs", 3, "hang")
    folder = _learner(tmp_path, "def hang():\n    open(os.path.join(os.environ['HOME'], 'left.bin'), 'wb')"
                                ".write(os.urandom(2**20))\n    while True:\n        pass\n")
    result = grade(course, "week01", folder, hardware=machine)
    checks = {c.id: c for c in result.checks}
    assert checks["hangs"].status == "error" and "longer than 3 s" in checks["hangs"].message
    assert checks["answers"].status == "passed"
    assert list(own_tmp.iterdir()) == [], "the grade left scratch behind"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_scratch_is_removed_when_the_grade_is_stopped(tmp_path, own_tmp, signum):
    """`infracourse grade` stopped by Ctrl-C or `kill` while learner code runs: it says so, and its scratch
    (the worker's folder and log among it) is gone."""
    course = _course(tmp_path / "course", "hangs", 60, "hang")
    ws = tmp_path / "ws"
    env = {**os.environ, "INFRACOURSE_COURSE": str(course.root), "INFRACOURSE_WORKSPACE": str(ws),
           "TMPDIR": str(own_tmp)}
    cli = [sys.executable, "-m", "infracourse"]
    for args in (["init", str(ws)], ["unlock", "week01"]):
        subprocess.run(cli + args, env=env, check=True, capture_output=True)
    (ws / "week01" / "probe.py").write_text("import os\n\n\ndef answer():\n    return 42\n\n\n"
                                            "def hang():\n    while True:\n        pass\n")
    proc = subprocess.Popen(cli + ["grade", "week01"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 60
    while not list(own_tmp.rglob("infracourse-worker-*.log")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(own_tmp.rglob("infracourse-worker-*.log")), "the grade never started its worker"
    time.sleep(0.5)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in out, out
    assert list(own_tmp.iterdir()) == [], "the stopped grade left scratch behind"


def test_a_regrade_stopped_by_ctrl_c_leaves_no_scratch(tmp_path, own_tmp):
    """Ctrl-C (SIGINT to the terminal's process group) while a regrade runs a submission that hangs: the
    instructor's process, its workers and their grades all stop, and no folder of theirs is left for a later
    regrade's sweep to find."""
    from infracourse.cohort import workers

    course = synthetic.write_course(tmp_path / "course", weeks=1, kernel_weeks=())
    bundle = synthetic.write_cohort(course, tmp_path / "bundles", learners=1, missing=0)[0]
    hanging = {**members(bundle), "files/answer.py": b"def answer():\n    while True:\n        pass\n"}
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    assert book.import_bundles([rezip(tmp_path / "hangs.zip", hanging, rehash=True)], course).committed
    script = ("import sys\nfrom pathlib import Path\nfrom infracourse.cohort.gradebook import Gradebook\n"
              "from infracourse.cohort.regrade import regrade\nfrom infracourse.course import Course\n"
              "regrade(Gradebook(Path(sys.argv[2])), Course(Path(sys.argv[1])), workers=1)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(course.root), str(book.path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    root = workers.scratch_root()
    deadline = time.monotonic() + 90
    while not list(root.rglob("infracourse-worker-*.log")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(root.rglob("infracourse-worker-*.log")), "the regrade never reached the learner's code"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    assert not root.exists() or not list(root.iterdir()), list(root.rglob("*"))[:10]


# ---------------------------------------------------------------- learner text shown
def _result(message: str) -> GradeResult:
    checks = [CheckResult("answers", "answer() is 42", "correctness", "cpu", "failed", message),
              CheckResult("fast", "fast", "performance", "cpu", "passed", "")]
    return GradeResult(week="week01", tier="cpu", device="cpu " + HOSTILE_TEXT, fingerprint="f",
                       started_at="2026-02-01T10:00:00", seconds=1.0, checks=checks)


def _shown_plain(text: str) -> None:
    for control in CONTROLS:
        assert control not in text, f"{control!r} reached the terminal:\n{text!r}"
    assert "[/]ada[bold]" in text and "forged" in text


def test_grade_and_watch_show_markup_as_typed_and_no_control_characters():
    console = Console(file=io.StringIO(), width=400, color_system=None)
    views.print_grade(console, _result(HOSTILE_TEXT))
    views.print_watch(console, _result(HOSTILE_TEXT), None)
    _shown_plain(console.file.getvalue())


def test_regrade_table_survives_a_learner_named_like_markup(monkeypatch):
    """A learner id of `[/]...` used to end `cohort regrade` with a MarkupError after its results were saved."""
    from infracourse.cli import app

    def fake_regrade(book, course, **kwargs):
        kwargs["on_submission"](submission)
        return [regrade.Regraded(submission, _result(HOSTILE_TEXT), _result(HOSTILE_TEXT),
                                 [{"check": HOSTILE_TEXT, "self": "passed", "verified": "failed"}])]

    submission = Submission(1, HOSTILE_TEXT, "week01", "2026-02-01T10:00:00Z", "bundle.zip")
    monkeypatch.setattr(regrade, "regrade", fake_regrade)
    monkeypatch.setattr(Gradebook, "__init__", lambda self, path: None)
    out = CliRunner().invoke(app, ["cohort", "regrade"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    _shown_plain(out.output.replace("\n", ""))


def test_a_command_gives_sigterm_back_to_its_caller(tmp_path, monkeypatch):
    """Commands turn SIGTERM into Ctrl-C while they run (so a kill cleans up), and only while they run."""
    from infracourse.cli import app

    monkeypatch.setenv("INFRACOURSE_WORKSPACE", str(tmp_path / "none"))
    before = signal.getsignal(signal.SIGTERM)
    CliRunner().invoke(app, ["status"])
    assert signal.getsignal(signal.SIGTERM) is before


def test_published_site_carries_no_control_characters(tmp_path):
    course = synthetic.write_course(tmp_path / "course", weeks=2, kernel_weeks=())
    site = publish_with_learner_text(course, tmp_path, HOSTILE_TEXT)
    pages = [p.read_text() for p in site.rglob("*.html")]
    assert any("forged" in page for page in pages), "the forged message is published (as text)"
    for page in pages:
        assert not any(control in page for control in CONTROLS)


def test_review_app_pages_carry_no_control_characters(tmp_path):
    """The instructor's review app (a gradebook view) shows a learner's report through the same finalize."""
    from infracourse.cohort.review import Review

    from test_cohort_review import _bundle, _course, _login, served

    course = _course(tmp_path / "course")
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    (tmp_path / "in").mkdir()
    report = f"# Report\n\n## Conclusion and limits\n\n{HOSTILE_TEXT}\n"
    assert book.import_bundles([_bundle(course, tmp_path / "in", "learner0", "week01", report)], course).committed
    review = Review(book, course)
    with served(review) as (sock, _):
        page = _login(sock, review, "ada").get(f"/submissions/{book.latest_submissions()[0].id}/")[1]
    assert "forged" in page
    assert not any(control in page for control in CONTROLS)


# ---------------------------------------------------------------- submit
@pytest.fixture
def graded(tmp_path):
    course = synthetic.write_course(tmp_path / "course", weeks=2, kernel_weeks=())
    ws = Workspace.init(tmp_path / "ws")
    ws.unlock(course, course.week("week02"))
    (ws.root / "week02" / "answer.py").write_text(synthetic.SOLUTION)
    hardware, ceilings = synthetic.DEVICES[0]
    ws.progress.record(synthetic.result_for(course.lab("week02"), hardware, ceilings, solved=True, share=0.8,
                                            started_at="2026-02-01T10:00:00"))
    return course, ws


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_submit_refuses_a_symlink_naming_it_and_the_fix(graded, tmp_path, kind):
    course, ws = graded
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "id_rsa").write_text("not the learner's to send\n")
    link = ws.root / "week02" / ("key.txt" if kind == "file" else "data")
    link.symlink_to(secret / "id_rsa" if kind == "file" else secret)
    with pytest.raises(BundleError) as refused:
        submit(ws, course, "week02", learner="ada", hardware=synthetic.DEVICES[0][0])
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and str(link) in message
    assert "symbolic link" in message and "replace the link with a copy" in message
    assert not (ws.root / "submissions").exists() or not any((ws.root / "submissions").iterdir())
    link.unlink()
    assert submit(ws, course, "week02", learner="ada", hardware=synthetic.DEVICES[0][0]).is_file()


def test_week14s_judge_reads_no_more_than_a_bounded_head_of_the_rank_log_it_polls(tmp_path, monkeypatch):
    """Week 14's judge polls rank 0's log (written by learner code) every 5 ms: a flooded log is read up to
    LOG_READ_LIMIT each time, never whole, and what lies past it is not evidence."""
    import importlib.util

    from conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "graders" / "week14"))  # its own imports (week14_references) are there
    spec = importlib.util.spec_from_file_location("week14_judging", REPO / "graders" / "week14" / "week14_judging.py")
    judge = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, judge)  # its dataclasses look their module up there
    spec.loader.exec_module(judge)
    log = tmp_path / "rank0.jsonl"
    step = json.dumps({"restart": 0, "step": 1, "time": 0.0}) + "\n"
    late = json.dumps({"restart": 1, "step": 99, "time": 0.0}) + "\n"
    log.write_text(step + "x" * (3 * judge.LOG_READ_LIMIT) + "\n" + late)
    started = time.perf_counter()
    lines = judge._lines(log)
    assert [line["step"] for line in lines] == [1]  # the line past the limit is never read
    assert time.perf_counter() - started < 1.0
