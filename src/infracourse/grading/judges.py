"""How the runner starts a judge process (pytest with the graders): fresh, or forked from a warm interpreter.

A fresh judge is `python -m pytest ...`: about 1.5 s of CPU goes to importing torch, numpy, pytest and pydantic
before the first check runs. A process that grades many times in a row (the course's own tests, `cohort
regrade`, `watch`) can keep one warm interpreter with those imported and fork each judge from it instead
(`keep_warm()`): the same command line, environment, working folder, file descriptors, session and
die-with-the-grade guarantees, without the imports.

What the warm interpreter holds is third-party code only. The course's modules (the plugin, the graders, the
kit) are imported by each judge after the fork, from the files as they are then, with the grade's environment
(TRITON_INTERPRET, TMPDIR, the kit lists), exactly as a fresh judge imports them. A grade whose environment
differs from the warm interpreter's in anything the runner does not set itself (a variable torch reads at import)
gets a fresh judge. Each forked judge reseeds Python's and numpy's generators, as a fresh interpreter would.

The learner's code never runs here: it runs in the sandboxed worker the judge starts, as before.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from infracourse.launch import group

# Imported once by the warm interpreter: nothing of the course, nothing that reads the grade's environment at import
# (triton reads TRITON_INTERPRET then: each judge imports it itself).
PRELOAD = ("torch", "numpy", "pytest", "_pytest.python", "_pytest.fixtures", "_pytest.junitxml", "pydantic", "yaml")
FRESH_ENV = "INFRACOURSE_FRESH_JUDGES"  # set (to anything): keep_warm() does nothing, every judge starts fresh
# Set by the runner for every grade (grading.runner._grader_env, kit_access.environment): a difference in these
# between the warm interpreter and a grade is expected; a difference in anything else sends the grade to a fresh judge.
GRADE_KEYS_PREFIXES = ("INFRACOURSE_",)
# Also: what pytest sets per test, and what torch sets in its own process on first use of the compiler and reads
# only then (so a grading process that compiled something once still forks its judges).
GRADE_KEYS = {"TMPDIR", "TRITON_INTERPRET", "PYTHONDONTWRITEBYTECODE", "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
              "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


class Judge(Protocol):
    """A started judge, as the runner sees it: its process id (the leader of its own session) and its end."""
    pid: int
    returncode: int | None

    def wait(self) -> int: ...


def start(args: list[str], *, cwd: Path, env: dict[str, str], log_fd: int, events_fd: int) -> Judge:
    """Start `pytest args` as a judge in `cwd` with `env`, its output to `log_fd`, `events_fd` open at the same
    number, in a session of its own that dies with this process: forked from the warm interpreter if one is
    kept and fits `env`, else a fresh interpreter."""
    warm = _warm
    if warm is not None and warm.fits(env):
        try:
            return warm.fork(args, cwd=cwd, env=env, log_fd=log_fd, events_fd=events_fd)
        except OSError:
            pass  # the warm interpreter is gone (killed, out of memory): this grade goes on fresh
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, stdout=log_fd,
                            stderr=subprocess.STDOUT, pass_fds=(events_fd,), start_new_session=True,
                            preexec_fn=group.parent_death_hook())  # dies with us, e.g. on a kill -9


def keep_warm() -> None:
    """From now on, fork this process's judges from one warm interpreter (started now; stopped at exit). For a
    process that grades many times; one grade alone gains nothing (the warm interpreter pays the imports once).
    If it cannot start, judges stay fresh: slower, never wrong."""
    global _warm
    if os.environ.get(FRESH_ENV):
        return
    with _lock:
        if _warm is None or not _warm.alive():
            try:
                _warm = WarmInterpreter.start()
            except (OSError, RuntimeError) as exc:
                print(f"infracourse: grading goes on with fresh judge processes ({exc})", file=sys.stderr)
                return
            atexit.register(_warm.stop)


def stop_warm() -> None:
    """Back to fresh judges; the warm interpreter is stopped."""
    global _warm
    with _lock:
        if _warm is not None:
            _warm.stop()
            _warm = None


def is_warm() -> bool:
    return _warm is not None and _warm.alive()


@dataclass
class ForkedJudge:
    """A judge forked by the warm interpreter: its pid, and the connection its exit status comes back on."""
    pid: int
    replies: BinaryIO  # the connection, read a line at a time
    returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            reply = _receive(self.replies)
            self.replies.close()
            # No reply: the warm interpreter died under it, and the judge with it (die-with-parent).
            self.returncode = int(reply["returncode"]) if reply else -signal.SIGKILL
        return self.returncode


class WarmInterpreter:
    """The runner's handle on the warm interpreter: a child process holding the other end of a socket pair.
    Each judge is asked for with a fresh connection passed over it; when this process ends (or stop()), the pair
    closes and the warm interpreter kills what it forked and exits."""

    def __init__(self, process: subprocess.Popen, control: socket.socket, env: dict[str, str]):
        self.process, self.control, self.env = process, control, env

    @classmethod
    def start(cls) -> WarmInterpreter:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        try:
            process = subprocess.Popen([sys.executable, "-m", "infracourse.grading.judges", str(theirs.fileno())],
                                       env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        finally:
            theirs.close()
        if ours.recv(16) != b"ready":  # the imports done (or an empty read: it died first)
            ours.close()
            process.wait()
            raise RuntimeError(f"the warm judge interpreter did not start (exit {process.returncode})")
        return cls(process, ours, env)

    def alive(self) -> bool:
        return self.process.poll() is None

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a judge with `env` may come from here: equal to this interpreter's start environment in every
        variable the runner does not set itself."""
        return self.alive() and not self.differences(env)

    def differences(self, env: dict[str, str]) -> list[str]:
        """The variables, outside those the runner sets, in which `env` differs from this interpreter's start."""
        names = {k for k in {*env, *self.env} if k not in GRADE_KEYS and not k.startswith(GRADE_KEYS_PREFIXES)}
        return sorted(k for k in names if env.get(k) != self.env.get(k))

    def fork(self, args: list[str], *, cwd: Path, env: dict[str, str], log_fd: int, events_fd: int) -> ForkedJudge:
        connection, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _lock:  # one message per judge on the shared pair
                socket.send_fds(self.control, [b"judge"], [theirs.fileno(), log_fd, events_fd])
            theirs.close()  # now: if the helper dies before it replies, the read below sees the end, not a hang
            request = json.dumps({"args": args, "cwd": str(cwd), "env": env, "events_fd": events_fd}).encode()
            connection.sendall(request + b"\n")
            replies = connection.makefile("rb")
            reply = _receive(replies)
            if not reply or "pid" not in reply:
                replies.close()
                raise OSError("the warm judge interpreter did not fork")
        finally:
            theirs.close()
            connection.close()  # the file object keeps the connection open until wait() closes it
        return ForkedJudge(pid=int(reply["pid"]), replies=replies)

    def stop(self) -> None:
        self.control.close()  # it reads the end of the pair, kills what it forked and exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            group.kill_group(self.process.pid)
            self.process.wait()


_warm: WarmInterpreter | None = None
_lock = threading.Lock()


def _receive(replies: BinaryIO) -> dict | None:
    """One newline-ended JSON line, or None if the other side closed first."""
    line = replies.readline()
    return json.loads(line) if line.endswith(b"\n") else None


# The warm interpreter's side: `python -m infracourse.grading.judges CONTROL_FD`.

def _serve(control_fd: int) -> None:
    import importlib  # why: only the warm interpreter imports its preload list by name

    control = socket.socket(fileno=control_fd)
    for name in PRELOAD:
        importlib.import_module(name)
    # The preloaded modules' ~180,000 objects live as long as any judge: kept out of the collector's sight, so a
    # judge's full collections (pytest runs five at its end; the automatic ones of a long check) walk only what the
    # judge made itself, about 30 ms each less (and the forked pages stay shared: a collection writes to them).
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the forked helpers are reaped by the kernel
    control.send(b"ready")
    while True:
        message, fds, _, _ = socket.recv_fds(control, 64, 3)
        if not message:  # the grading process ended (or stopped us): nothing forked outlives it
            os.killpg(0, signal.SIGKILL)
        if os.fork() == 0:
            control.close()
            _watch_one(fds)  # never returns
        for fd in fds:
            os.close(fd)


def _watch_one(fds: list[int]) -> None:
    """In a helper forked per judge: read the request, fork the judge, say its pid, then its exit status."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        group.die_with_parent()
        connection_fd, *judge_fds = fds
        connection = socket.socket(fileno=connection_fd)
        request = json.loads(connection.makefile("rb").readline())
        pid = os.fork()
        if pid == 0:
            connection.close()
            _become_judge(request, judge_fds)  # never returns
        for fd in judge_fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        connection.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    finally:
        os._exit(0)


def _become_judge(request: dict, fds: list[int]) -> None:
    """The forked judge: what `python -m pytest ARGS` started by subprocess.Popen(cwd, env, stdout=log,
    stderr=STDOUT, pass_fds=(events,), start_new_session=True) would be, from here on."""
    code = 1
    try:
        os.setsid()
        group.die_with_parent()
        log, events = fds
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(events, request["events_fd"])
        for fd in {log, events} - {1, 2, request["events_fd"]}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _as_a_fresh_interpreter(request["env"], request["args"])
        import pytest  # why: preloaded in the warm interpreter; the runner's side never needs it

        code = pytest.main(request["args"])
        code = int(code)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported in the judge's log, as an interpreter would
        import traceback  # why: only a judge that crashed before pytest ran needs it

        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # what the interpreter runs at exit (a weakref finaliser, a grader's cleanup)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _as_a_fresh_interpreter(env: dict[str, str], args: list[str]) -> None:
    """What `python -m pytest ARGS` in this environment would have that a fork of the warm interpreter does not."""
    import random  # why: these three run in the forked judge only, where the warm interpreter has them loaded

    import numpy
    import pytest

    sys.dont_write_bytecode = env.get("PYTHONDONTWRITEBYTECODE", "") != ""
    sys.argv = [str(Path(pytest.__file__).with_name("__main__.py")), *args]
    sys.path[0] = os.getcwd()  # `-m` puts the working folder first; PYTHONPATH is the same (fits), so is the rest
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    tempfile.tempdir = None  # read TMPDIR again
    random.seed()
    numpy.random.seed()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
