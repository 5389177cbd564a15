"""The one place that starts confined processes: the grading worker, a torchrun world, a learner's uvicorn
server, a program the judge runs from the learner's files (a script, a kit driver), and `infracourse run`.

    env = launch.environment(scratch, device="cpu", EXTRA="1")   # the judge's variables stripped to a few
    proc = launch.start([sys.executable, "-s", "-m", "mod"], scratch=scratch, snapshot=learner_dir, env=env,
                        log=scratch.parent / "mod.log")           # confined; stdout and stderr into the log
    code = proc.finish(timeout_s=60)                              # None: killed at the limit
    proc.tail()                                                   # the end of what it printed (bounded)

Every process started here gets the same four things, so no caller builds them again:
- confinement: infracourse.sandbox's bwrap command line where a sandbox can be made (`confining()`), else it
  runs plain with the same environment (the runner has said so in the grade);
- a clean environment (`environment`): the judge's own variables stripped to ENV_KEEP, HOME and TMPDIR in the
  scratch folder, and PYTHONPATH naming only the folder that holds the engine (`engine_path`);
- a session of its own and death with the judge (launch.group): `Launched.kill_tree` kills what it started;
- its output copied into a log up to output.OUTPUT_LIMIT (launch.output), read back only by its tail.

A launch that overran its time limit can be remembered for the rest of the grade (launch.hangs), so that
the next launch of the same learner code is not started and its check says why.

This package sits below both the judge (infracourse.grading) and the course kit (infracourse.kit), which both
start processes through it; it imports neither.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infracourse import sandbox
from infracourse.launch import group, output
from infracourse.launch.group import die_with_parent, kill_group

__all__ = ["ENV_KEEP", "Launched", "confining", "die_with_parent", "engine_path", "environment", "kill_group",
           "output", "start"]

# The judge's variables a confined process keeps: the interpreter's and the libraries' own settings, never the
# judge's paths (PYTHONPATH, the workspace) or anything naming the grade.
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "TRITON_INTERPRET",
            "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_HOME",
            "TRITON_PTXAS_PATH", "NUMBA_DISABLE_JIT", "PYTORCH_CUDA_ALLOC_CONF")


# ONE_THREAD: why a grade's processes run one OpenMP thread each (the judge too: grading.plugin). A grade is a
# judge, a worker and often ranks or a server, taking turns, on a machine that may run several grades; OpenMP's
# threads spin after each parallel region, so two threads a process on a shared 2-core machine burn the cores the
# other processes wait for. Weeks 4 and 6's proofs took 251 CPU-seconds with torch's default threads and 154 with
# one (130 s and 81 s of wall time at three at once, docs/grading-times.md). A check that measures threads sets its own count
# (kit.threads, kit.intra_op); a learner who exports OMP_NUM_THREADS keeps it.


def confining() -> bool:
    """Whether processes started here run in a sandbox on this machine."""
    return sandbox.status().available


def engine_path() -> str:
    """PYTHONPATH for a confined process: the folder holding the infracourse engine, where the sandbox shows the
    engine package alone. Not the judge's own PYTHONPATH: the sandbox hides its entries (sandbox.course_places)."""
    return str(sandbox.engine_dir().parent)


def environment(scratch: Path, *, device: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a confined process: the judge's variables stripped to ENV_KEEP, HOME and TMPDIR in
    `scratch`, unbuffered output (what it printed before a crash reaches its log), no bytecode written, and the
    engine importable, and one OpenMP thread unless the judge set a count (ONE_THREAD above). With `device`
    ("cpu" or "cuda"), for code that runs a model: INFRACOURSE_DEVICE, and no visible GPU on "cpu". `extra` is
    added last."""
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP}
    env.update(HOME=str(scratch), TMPDIR=str(scratch), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=engine_path(), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    if device is not None:
        env.update(INFRACOURSE_DEVICE=device)
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


class Launched(subprocess.Popen):
    """A process started by `start`: a Popen (poll, wait, communicate, pid, stdout...) that also knows its
    log and can kill everything it started."""

    capture: output.Capture | None = None  # its stdout and stderr as the judge keeps them (start's `log`)
    confined: bool = False                 # it runs in a sandbox (its init is bwrap)

    def kill_tree(self) -> None:
        """SIGKILL the process and everything it started (its session; in a sandbox, the whole PID namespace)."""
        kill_group(self.pid)

    def finish(self, timeout_s: float | None = None) -> int | None:
        """Wait for it to exit, killing its tree past `timeout_s`; its exit status, or None if it was killed at
        the limit. Its log is whole afterwards."""
        try:
            code = self.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_tree()
            self.wait()
            code = None
        if self.capture is not None:
            self.capture.finish()
        return code

    def tail(self, max_bytes: int = output.TAIL_BYTES) -> str:
        """The end of what it printed (its log), at most `max_bytes`; whole once it has exited."""
        if self.capture is None:
            return ""
        if self.poll() is not None:
            self.capture.finish()
        return self.capture.tail(max_bytes)

    @property
    def cut(self) -> bool:
        """It printed past output.OUTPUT_LIMIT and was killed for it."""
        return self.capture is not None and self.capture.cut


def start(command: list[str], *, scratch: Path, snapshot: Path | None = None, env: dict[str, str] | None = None,
          gpu: bool = False, writable: tuple[tuple[Path, Path], ...] = (), cwd: Path | None = None,
          log: Path | None = None, own_session: bool = True, **popen) -> Launched:
    """Start `command` confined (sandbox.wrap: `snapshot` read-only, `scratch` and `writable` read-write, the GPU
    with `gpu`) in the working folder `cwd` (default: `scratch`), with `env` (default: `environment(scratch)`),
    in a session of its own (`own_session=False` only for an interactive command the learner types at), dying
    with the judge. `log`: its stderr, and its stdout unless `popen` names one, go to that file, cut past
    output.OUTPUT_LIMIT (the process tree killed). Other keyword arguments go to subprocess.Popen."""
    scratch = Path(scratch)
    confined = confining()
    if confined:
        command = sandbox.wrap(command, snapshot=snapshot, scratch=scratch, gpu=gpu, writable=writable)
    popen.setdefault("stdin", subprocess.DEVNULL)
    options = dict(env=environment(scratch) if env is None else env, cwd=cwd or scratch,
                   start_new_session=own_session, preexec_fn=group.parent_death_hook(), **popen)
    if log is None:
        proc = Launched(command, **options)
    else:
        capture = output.Capture(log)
        streams = (lambda fd: {"stderr": fd}) if "stdout" in popen else \
            (lambda fd: {"stdout": fd, "stderr": subprocess.STDOUT})
        proc = capture.spawn(lambda fd: Launched(command, **options, **streams(fd)))
        proc.capture = capture
    proc.confined = confined
    return proc
