"""What confined learner code prints, as the judge keeps it: captured up to a limit, read only by its tail.

Every confined process (the grading worker, a learner's server, a torchrun world, a learner's script) writes
its stdout and stderr into a pipe; a thread of the judge copies the pipe into a log file, up to OUTPUT_LIMIT
bytes. Past the limit the process tree is killed (its check ends `error` with `CUT_NOTE`), so learner code
can neither fill the disk through its output nor make the judge hold it. Whatever reads a log (a message
quoting the end of a crash, a server's last error) reads at most TAIL_BYTES from its end (`read_tail`): a log
can be as long as the limit, or longer where learner code wrote the file itself.
"""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Callable, Iterator

from infracourse.launch.group import kill_group

OUTPUT_LIMIT = 64 * 2**20  # far above any honest grade's output (a few KiB), far below a disk or a judge's memory
TAIL_BYTES = 64 * 2**10    # what a message may quote of a log's end, at most
CHUNK = 2**20
CUT_NOTE = (f"its output was cut at {OUTPUT_LIMIT // 2**20} MiB and it was stopped: a grade keeps at most "
            f"{OUTPUT_LIMIT // 2**20} MiB of what learner code prints, so that it cannot fill the disk or the "
            "grader's memory; print less (no print inside a loop)")


def read_tail(path: Path, max_bytes: int = TAIL_BYTES) -> str:
    """The last `max_bytes` of a file as text (seeking from its end, whatever its size); '' if unreadable."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            return f.read(max_bytes).decode(errors="replace")
    except OSError:
        return ""


def last_lines(text: str, lines: int, max_chars: int = 2000) -> str:
    """The last `lines` lines of `text`, at most `max_chars` characters of them (a line can be any length)."""
    return "\n".join(text.strip().splitlines()[-lines:])[-max_chars:]


class OutputCut(Exception):
    """A process's stdout passed OUTPUT_LIMIT while the judge read it line by line: the process was killed."""


def lines(proc: subprocess.Popen, limit: int = OUTPUT_LIMIT) -> Iterator[str]:
    """A text-mode process's stdout line by line as it comes, for a judge that must act on each line as it
    arrives (a longer line than TAIL_BYTES comes in pieces). Past `limit` characters in all, the process's
    session is killed and OutputCut raised."""
    seen = 0
    for text in iter(lambda: proc.stdout.readline(TAIL_BYTES), ""):
        seen += len(text)
        if seen > limit:
            kill_group(proc.pid)
            raise OutputCut(CUT_NOTE)
        yield text


class Capture:
    """One process's output, copied into `path` up to `limit` bytes: start the process with `spawn`.

    Past the limit the process's session is killed (`cut` says so); the copying thread keeps reading, and
    dropping, until every writer is gone, so a process that outlives the kill never blocks."""

    def __init__(self, path: Path, *, limit: int = OUTPUT_LIMIT):
        self.path, self.limit = Path(path), limit
        self.written = 0
        self.cut = False
        self._thread: threading.Thread | None = None

    def spawn(self, start: Callable[[int], subprocess.Popen]) -> subprocess.Popen:
        """`start(fd)` starts the process, in a session of its own, with `fd` as its stdout (and stderr)."""
        read_fd, write_fd = os.pipe()
        try:
            proc = start(write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the process has its copy: the pipe ends when the process (and its children) do
        self._thread = threading.Thread(target=self._copy, args=(read_fd, lambda: kill_group(proc.pid)),
                                        name="infracourse-output", daemon=True)
        self._thread.start()
        return proc

    def _copy(self, read_fd: int, kill: Callable[[], None]) -> None:
        try:
            with open(self.path, "wb") as log:
                while chunk := os.read(read_fd, CHUNK):
                    room = self.limit - self.written
                    if room > 0:
                        log.write(chunk[:room])
                        log.flush()  # readable while the process runs (a server's log during its grade)
                    self.written += len(chunk)
                    if self.written > self.limit and not self.cut:
                        self.cut = True
                        kill()
        except OSError:
            pass  # the log's folder was removed under a process still printing: nothing more to keep
        finally:
            os.close(read_fd)

    def finish(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until everything the process printed before it ended is in the log."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def tail(self, max_bytes: int = TAIL_BYTES) -> str:
        return read_tail(self.path, max_bytes)

