"""The sandbox itself: what infracourse.sandbox reports, and that CI really has one."""
import os
import subprocess
from pathlib import Path

import pytest

from infracourse import sandbox


def test_status_says_what_it_isolates_or_why_not():
    status = sandbox.status()
    text = status.describe()
    assert text.startswith("bubblewrap (") if status.available else text.startswith("unavailable: ")


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI must have the sandbox (a developer may not)")
def test_ci_has_the_sandbox():
    # the attack suite skips where no sandbox works: on CI that would silently prove nothing
    assert sandbox.status().available, sandbox.status().describe()


@pytest.mark.skipif(not sandbox.status().available, reason="needs the sandbox")
@pytest.mark.parametrize("under", ["/tmp", "/home", "/root", "/work"])
def test_nothing_on_the_engines_path_is_writable_wherever_the_checkout_is(tmp_path, monkeypatch, under):
    """A checkout in a home folder (or /tmp, /root) puts the engine's parent folder, a sys.path entry inside,
    in one of the sandbox's own writable tmpfs: found by the attack suite run as an unprivileged user from
    /tmp, where hostile code wrote sitecustomize.py there. The engine's folder is bound where it is, so the
    inside path is what matters: the real engine is bound at a path under `under`."""
    engine = tmp_path / "src" / "infracourse"
    engine.mkdir(parents=True)
    (engine / "__init__.py").write_text("")
    inside = Path(under) / f"infracourse-test-{os.getpid()}" / "src" / "infracourse"
    monkeypatch.setattr(sandbox, "engine_dir", lambda: inside)
    args = sandbox.wrap(["sh", "-c", f"touch {inside.parent}/sitecustomize.py && echo wrote"],
                        snapshot=None, scratch=tmp_path)
    args[args.index(str(inside))] = str(engine)  # --ro-bind ENGINE INSIDE: the copy's files at the inside path
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert "wrote" not in done.stdout and "Read-only file system" in done.stderr, done.stdout + done.stderr


@pytest.mark.skipif(not sandbox.status().available, reason="needs the sandbox")
def test_course_content_and_network_are_out_of_reach(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    snapshot, scratch = tmp_path / "learner", tmp_path / "scratch"
    snapshot.mkdir()
    scratch.mkdir()
    probe = ("import os, socket\n"
             f"print(os.path.exists({repo + '/labs'!r}), os.path.exists({repo + '/graders'!r}))\n"
             "s = socket.socket(); s.settimeout(1)\n"
             "try:\n    s.connect(('127.0.0.1', 22)); print('net')\nexcept OSError:\n    print('no-net')\n"
             f"open({str(snapshot / 'x')!r}, 'w')\n")
    done = subprocess.run(sandbox.wrap(["python3", "-c", probe], snapshot=snapshot, scratch=scratch),
                          capture_output=True, text=True, timeout=60)
    lines = done.stdout.split()
    assert lines[:3] == ["False", "False", "no-net"], done.stdout + done.stderr
    assert "Read-only file system" in done.stderr  # the snapshot cannot be changed from inside
