"""A judge forked from the warm interpreter is the judge a fresh `python -m pytest` would be (grading.judges)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from infracourse.grading import judges

REPORTER = textwrap.dedent('''
    import json, os, random, sys, tempfile
    import numpy

    def test_report():
        events = int(os.environ["INFRACOURSE_TEST_EVENTS_FD"])
        seen = {
            "cwd": os.getcwd(), "path": [p.replace(os.getcwd(), "<here>") for p in sys.path], "argv": [os.path.basename(sys.argv[0])] + sys.argv[2:],
            "tmp": tempfile.gettempdir(), "no_bytecode": sys.dont_write_bytecode,
            "session_leader": os.getsid(0) == os.getpid(), "marker": os.environ.get("JUDGE_MARKER"),
            "random": random.random(), "numpy": float(numpy.random.random()),
            "triton": "triton" in sys.modules, "course": sorted(m for m in sys.modules if m.startswith("infracourse.grading.runner")),
        }
        os.write(events, (json.dumps(seen) + "\\n").encode())
''')


def run_judge(tmp_path, name, env_extra=None, test=REPORTER):
    folder = tmp_path / name
    (folder / "graders").mkdir(parents=True)
    (folder / "graders" / "test_report.py").write_text(test)
    (folder / "tmp").mkdir()
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, TMPDIR=str(folder / "tmp"), PYTHONDONTWRITEBYTECODE="1", INFRACOURSE_SEED="7",
               INFRACOURSE_TEST_EVENTS_FD=str(write_fd), **(env_extra or {}))
    with (folder / "log").open("wb") as log:
        try:
            judge = judges.start([str(folder / "graders"), "-q", "-p", "no:cacheprovider"], cwd=folder, env=env,
                                 log_fd=log.fileno(), events_fd=write_fd)
        finally:
            os.close(write_fd)
        with os.fdopen(read_fd, "rb") as events:
            line = events.readline()
        code = judge.wait()
    assert code == 0, (folder / "log").read_text()
    return judge, json.loads(line), folder


@pytest.fixture
def warm(monkeypatch):
    """A warm interpreter of this test's own, started with the environment as it is now."""
    interpreter = judges.WarmInterpreter.start()
    monkeypatch.setattr(judges, "_warm", interpreter)
    yield interpreter
    interpreter.stop()


def test_a_forked_judge_sees_what_a_fresh_one_sees(tmp_path, warm, monkeypatch):
    forked, seen, folder = run_judge(tmp_path, "forked", {"INFRACOURSE_EXTRA": "grade's own"})
    assert isinstance(forked, judges.ForkedJudge)
    fresh_run = judges._warm
    monkeypatch.setattr(judges, "_warm", None)
    fresh, seen_fresh, fresh_folder = run_judge(tmp_path, "fresh")
    monkeypatch.setattr(judges, "_warm", fresh_run)
    assert isinstance(fresh, subprocess.Popen)
    for key in ("no_bytecode", "session_leader", "argv", "triton", "course", "path"):
        assert seen[key] == seen_fresh[key], key
    assert seen["cwd"] == str(folder) and seen_fresh["cwd"] == str(fresh_folder)
    assert seen["tmp"] == str(folder / "tmp")
    assert seen["no_bytecode"] and seen["session_leader"] and not seen["triton"] and not seen["course"]
    assert seen["argv"] == ["__main__.py", "-q", "-p", "no:cacheprovider"]


def test_each_forked_judge_draws_its_own_random_numbers(tmp_path, warm):
    _, first, _ = run_judge(tmp_path, "one")
    _, second, _ = run_judge(tmp_path, "two")
    assert first["random"] != second["random"] and first["numpy"] != second["numpy"]


def test_an_environment_the_warm_interpreter_was_not_started_with_gets_a_fresh_judge(tmp_path, warm):
    judge, seen, _ = run_judge(tmp_path, "other", {"JUDGE_MARKER": "torch may read this at import"})
    assert isinstance(judge, subprocess.Popen) and seen["marker"] == "torch may read this at import"


def test_a_killed_judge_reports_the_signal(tmp_path, warm):
    folder = tmp_path / "sleepy"
    (folder / "graders").mkdir(parents=True)
    (folder / "graders" / "test_sleep.py").write_text("import time\n\ndef test_sleep():\n    time.sleep(60)\n")
    read_fd, write_fd = os.pipe()
    with (folder / "log").open("wb") as log:
        judge = judges.start([str(folder / "graders"), "-q", "-p", "no:cacheprovider"], cwd=folder,
                             env=dict(os.environ), log_fd=log.fileno(), events_fd=write_fd)
    os.close(write_fd)
    os.close(read_fd)
    assert isinstance(judge, judges.ForkedJudge)
    time.sleep(1)
    os.killpg(judge.pid, signal.SIGKILL)  # what the runner does to a check that overran
    assert judge.wait() == -signal.SIGKILL


def test_nothing_forked_outlives_the_process_that_kept_it_warm(tmp_path):
    """kill -9 of the grading process: its warm interpreter and the judge running in it die too."""
    script = textwrap.dedent(f'''
        import os, sys, time
        from pathlib import Path
        from infracourse.grading import judges
        judges.keep_warm()
        folder = Path({str(tmp_path)!r})
        (folder / "graders").mkdir()
        (folder / "graders" / "test_sleep.py").write_text(
            "import os, time\\n\\ndef test_sleep():\\n    open('judge.pid', 'w').write(str(os.getpid()))\\n"
            "    time.sleep(120)\\n")
        r, w = os.pipe()
        log = open(folder / "log", "wb")
        judge = judges.start([str(folder / "graders"), "-q", "-p", "no:cacheprovider"], cwd=folder,
                             env=dict(os.environ), log_fd=log.fileno(), events_fd=w)
        print(judges._warm.process.pid, flush=True)
        time.sleep(120)
    ''')
    env = dict(os.environ)
    env.pop(judges.FRESH_ENV, None)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    warm_pid = int(owner.stdout.readline())
    pid_file = tmp_path / "judge.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, (tmp_path / "log").read_text()
        time.sleep(0.1)
    judge_pid = int(pid_file.read_text())
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 15
    while _alive(judge_pid) or _alive(warm_pid):
        assert time.monotonic() < deadline, "a judge or the warm interpreter outlived the process that owned them"
        time.sleep(0.1)


def test_the_warm_interpreter_imports_nothing_of_the_course_or_of_triton():
    """Course modules and triton read the grade's files and environment when imported: each judge imports them."""
    assert not [m for m in judges.PRELOAD if m.split(".")[0] in ("infracourse", "triton")]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
