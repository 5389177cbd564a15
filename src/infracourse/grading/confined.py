"""Programs the judge runs from the learner's files, confined like the grading worker.

Some checks are about a program rather than a function: "your experiment reproduces from a clean checkout",
"training resumes after a SIGKILL". The judge starts those programs itself, in the sandbox (the learner's
snapshot read-only, a scratch folder read-write, no network), with the worker's clean environment and a
session of their own so the whole tree can be killed; what they write is untrusted data the judge re-derives.
Where no sandbox can be made on the machine the program runs plain, with the same environment (the runner
has already said so in the grade).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def environment(scratch: Path, **extra: str) -> dict[str, str]:
    """The grading worker's environment: the judge's own variables stripped to the few a run needs."""
    from infracourse.grading.remote import _ENV_KEEP, _engine_path

    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    env.update(HOME=str(scratch), TMPDIR=str(scratch), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=_engine_path())
    env.update(extra)
    return env


def popen(command: list[str], *, snapshot: Path, scratch: Path, gpu: bool = False,
          env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start `command` confined, working directory `scratch`."""
    from infracourse import sandbox

    if sandbox.status().available:
        command = sandbox.wrap(command, snapshot=snapshot, scratch=scratch, gpu=gpu)
    return subprocess.Popen(command, env=env or environment(scratch), cwd=scratch, start_new_session=True,
                            **kwargs)


@dataclass
class ScriptRun:
    command: str  # as the learner would type it
    returncode: int | None  # None: killed at the time limit
    output: str  # stdout and stderr together
    wall_s: float

    def failure(self, limit_s: float) -> str | None:
        """None when the program ran to a clean exit; otherwise what happened, with the end of its output."""
        if self.returncode == 0:
            return None
        tail = "\n".join(self.output.strip().splitlines()[-12:])
        what = (f"did not finish within {limit_s:.0f} s" if self.returncode is None
                else f"exited with status {self.returncode}")
        return f"`{self.command}` {what}" + (f"; the end of its output:\n{tail}" if tail else " and printed nothing")


def run_script(snapshot: Path, script: str, args: list[str], *, scratch: Path, gpu: bool = False,
               timeout_s: float = 120) -> ScriptRun:
    """Run `python SCRIPT ARGS` from the learner's snapshot (only the files they submitted), in the empty
    scratch folder: the clean checkout a reader of their report would start from."""
    from infracourse.grading.torchrun import kill_tree

    snapshot = Path(snapshot).resolve()
    started = time.perf_counter()
    proc = popen([sys.executable, "-s", str(snapshot / script), *args], snapshot=snapshot, scratch=scratch,
                 gpu=gpu, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        output, _ = proc.communicate()
        code = None
    return ScriptRun(" ".join(["python", script, *args]), code, output or "", time.perf_counter() - started)
