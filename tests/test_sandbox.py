"""The sandbox itself: what infracourse.sandbox reports, and that CI really has one."""
import os
import subprocess

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
