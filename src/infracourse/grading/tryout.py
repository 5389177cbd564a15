"""`infracourse run`: the learner's own command, run the way a grade runs their code, before grading.

A learner who tries a kernel with plain `python bench.py` on a machine without a GPU gets Triton's
"0 active drivers"; the grade runs the same file under the interpreter. So this runs their command with what
a grade gives the worker: TRITON_INTERPRET=1 where there is no GPU, the worker's clean environment, this
week's course kit only, and the sandbox where one works (started by infracourse.launch, as a grade's are). The week folder itself is the
working folder and stays writable, so what the command writes (a CSV, a plot) lands beside the learner's
files. It is a try-out: nothing is graded or recorded.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

from infracourse import kit_access, launch
from infracourse.course import LabDir
from infracourse.hardware import Hardware

PYTHONS = ("python", "python3")  # the learner's `python` is this environment's, as in a grade


def grade_environment(lab: LabDir, hardware: Hardware, scratch: Path) -> dict[str, str]:
    """The grading worker's environment for this week on this machine (without the grade's own channels)."""
    extra = kit_access.environment(lab.spec.kit, lab.graders)
    if hardware.gpu_count == 0:
        extra["TRITON_INTERPRET"] = "1"  # Triton kernels run on the CPU through the interpreter, as graded
    return launch.environment(scratch, **extra)


def run_like_a_grade(lab: LabDir, folder: Path, command: list[str], hardware: Hardware) -> int:
    """Run `command` (default: an interactive `python`) in the week `folder` as a grade would run the
    learner's code; returns its exit status."""
    command = list(command) or ["python"]
    if command[0] in PYTHONS:
        command[0] = sys.executable
    folder = folder.resolve()
    with tempfile.TemporaryDirectory(prefix=f"infracourse-run-{lab.spec.week}-") as tmp:
        scratch = Path(tmp)
        env = grade_environment(lab, hardware, scratch)
        # the learner types at it: it stays in the terminal's session (Ctrl-C reaches it), and dies with us
        if not launch.confining():
            return _call(launch.start(command, scratch=scratch, env=env, cwd=folder, own_session=False,
                                      stdin=None))
        inside = scratch / folder.name  # the week folder, bound read-write under the sandbox's scratch
        inside.mkdir()
        # the sandbox starts in its scratch: the command starts in the week folder, as the learner typed it
        in_folder = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', str(inside), *command]
        with mock.patch.dict(os.environ, {k: env[k] for k in (kit_access.VISIBLE_ENV, kit_access.HANDOUT_ENV)}):
            proc = launch.start(in_folder, scratch=scratch, env=env, gpu=hardware.gpu_count > 0,
                                writable=((folder, inside),), own_session=False, stdin=None)
        return _call(proc)


def _call(proc: launch.Launched) -> int:
    """Its exit status once it ends, as subprocess.call waits (killed if we are interrupted meanwhile)."""
    with proc:
        try:
            return proc.wait()
        except BaseException:
            proc.kill()
            raise
