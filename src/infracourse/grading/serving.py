"""Judge side of the serving labs: the learner's HTTP server runs under uvicorn, confined like the worker.

    with serve(learner.root, "server:app", scratch=tmp, env={"INFRACOURSE_SERVE": "..."},
               ready_timeout_s=30, device="cpu") as server:         # Server: .uds, .base_url, .proc, .started_s
        status, headers, body = server.request("GET", "/health")    # one plain request (JSON body optional)
        state = server.get_json("/debug/state")                     # 200 + JSON, or ServerFailed saying why
        records, duration_s = server.load(specs, concurrency=8)     # kit.loadgen.run_load over the socket
        stream = server.stream({"prompt": [1, 2], "max_tokens": 9, "stream": True})   # a raw stream the judge
        for t, event in stream.events(): ...                        #   holds: (arrival, JSON or "[DONE]");
        stream.close()                                              #   close() hangs up mid-stream
        server.alive(), server.log_tail(), server.last_error(), server.require_alive("during X")

uvicorn is the real server (as vLLM serves), started as `python -m uvicorn MODULE:APP --uds SOCK` with the
learner's snapshot as its import path. The sandbox has no network the judge shares (infracourse.sandbox), so
the server listens on a Unix socket inside the scratch folder, which the judge opens from outside. The judge
speaks plain HTTP/1.1 to it (kit.loadgen for the streamed completions, `request` for the rest); everything
it answers is evidence, checked against the judge's own references and clock. On leaving the block the whole
process tree is killed; a server that died on its own while in use is reported with the tail of its log.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from infracourse import launch
from infracourse.failures import LabCheckFailed
from infracourse.launch import hangs, output
from infracourse.kit.loadgen import UnixHTTPConnection, run_load

SOCKET_NAME = "server.sock"
LOG_NAME = "server.log"
_MAX_SOCKET_PATH = 100  # AF_UNIX paths hold 107 bytes on Linux; keep a margin


@dataclass
class Phase:
    """What one phase of a served grade saw (the judge drives a server once through several phases and each
    check reads its own), or why it could not run: `failure`, re-raised by the checks that need it."""
    failure: str | None = None
    data: dict = field(default_factory=dict)

    def get(self) -> dict:
        if self.failure:
            raise LabCheckFailed(self.failure)
        return self.data


def run_phase(phases: dict, name: str, server: "Server", fn, *args, teach=lambda server, what: what,
              who: str = "server") -> None:
    """phases[name] = what fn(server, *args) saw, or the failure its checks will report: a LabCheckFailed as
    `teach(server, message)` words it, any other exception as a phase the learner's `who` broke (its checks
    fail, the other phases still run)."""
    try:
        phases[name] = Phase(data=fn(server, *args))
    except LabCheckFailed as exc:
        phases[name] = Phase(failure=teach(server, str(exc)))
    except Exception as exc:  # noqa: BLE001
        dead = "" if server.alive() else f" (your {who} has exited)"
        phases[name] = Phase(failure=teach(server, f"the judge's {name} phase could not complete{dead}: "
                                                   f"{type(exc).__name__}: {exc}"))


class ServerFailed(LabCheckFailed):
    """The learner's server did not start, or died while the judge was using it (the message has its log)."""


@dataclass
class Server:
    """A running learner server: its socket, its process (the sandbox's) and its log file."""
    uds: str
    proc: launch.Launched
    log_path: Path
    base_url: str = "http://localhost"
    started_s: float = field(default=0.0)  # seconds from launch until it first answered
    captured: output.Capture | None = field(default=None, repr=False)  # its stdout and stderr, as the judge took them
    made: Path | None = field(default=None, repr=False)  # a scratch folder start() made for it: stop() removes it

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        if self.captured is not None and not self.alive():
            self.captured.finish()  # it has exited: what it printed before that is in the log
        return output.read_tail(self.log_path, chars)

    def last_error(self) -> str:
        """The log's last line naming an exception (`ImportError: ...`), or ''."""
        lines = [x.strip() for x in self.log_tail(20000).splitlines()
                 if re.match(r"^[\w.]*(Error|Exception|Exit)\b", x.strip())]
        return lines[-1] if lines else ""

    def _died(self, when: str) -> str:
        error = self.last_error()
        cut = f"; {output.CUT_NOTE}" if self.captured is not None and self.captured.cut else ""
        return (f"your server exited {when} (code {self.proc.returncode}){': ' + error if error else ''}{cut}; the "
                f"end of its log:\n{self.log_tail()}")

    def require_alive(self, what: str = "") -> None:
        """ServerFailed with the log's tail when the server has exited."""
        if not self.alive():
            raise ServerFailed(self._died(what))

    def request(self, method: str, path: str, body: dict | None = None, *,
                timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        """One plain HTTP request over the socket: (status, headers lower-cased, body bytes). A JSON `body` is
        sent with its Content-Type. Connection errors raise (OSError, http.client.HTTPException)."""
        conn = UnixHTTPConnection(self.uds, timeout_s)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get_json(self, path: str, *, timeout_s: float = 10.0):
        """GET `path` and parse the answer as JSON; ServerFailed naming the path when it is not a 200 JSON."""
        try:
            status, _, body = self.request("GET", path, timeout_s=timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            self.require_alive(f"while answering GET {path}")
            raise ServerFailed(f"GET {path} got no answer from your server ({type(exc).__name__}: {exc})") from None
        if status != 200:
            raise ServerFailed(f"GET {path} answered HTTP {status}, expected 200 with JSON: {body[:300]!r}")
        try:
            return json.loads(body)
        except ValueError:
            raise ServerFailed(f"GET {path} did not answer JSON: {body[:300]!r}") from None

    def stream(self, body: dict, *, timeout_s: float = 10.0) -> "Stream":
        """POST /v1/completions with `body` on a raw socket the judge holds: read its events one by one, or
        close it mid-stream (a client that goes away)."""
        return Stream.open(self.uds, body, timeout_s)

    def load(self, specs: Sequence, **kwargs):
        """kit.loadgen.run_load against this server (same keyword arguments, `uds` filled in):
        (records in spec order, duration_s on the judge's clock)."""
        return run_load(specs, uds=self.uds, base_url=self.base_url, **kwargs)


class Stream:
    """One streamed completion on a raw socket: `status` (the HTTP status), `events()` yields (arrival time,
    parsed JSON or the string "[DONE]") as they come; `close()` hangs up at any point."""

    def __init__(self, sock: socket.socket, status: int, headers: dict[str, str], rest: bytes, sent: float):
        self.sock, self.status, self.headers, self._buf, self.sent = sock, status, headers, rest, sent
        self.ended = False  # the server closed the stream (or ended its body)

    @classmethod
    def open(cls, uds: str, body: dict, timeout_s: float) -> "Stream":
        payload = json.dumps(body).encode()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(uds)
        sent = time.perf_counter()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload)
        buf = b""
        while b"\r\n\r\n" not in buf:
            piece = sock.recv(65536)
            if not piece:
                break
            buf += piece
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        stream = cls(sock, status, headers, b"", sent)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            stream._raw = rest
        else:
            stream._buf = rest
        return stream

    def _read(self) -> bool:
        """More of the body into _buf (chunked transfer encoding undone); False when the server has ended it."""
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        while True:
            if chunked and self._raw_chunk():
                return True
            try:
                piece = self.sock.recv(65536)
            except OSError:
                piece = b""
            if not piece:
                self.ended = True
                return False
            if not chunked:
                self._buf += piece
                return True
            self._raw += piece

    _raw = b""

    def _raw_chunk(self) -> bool:
        """Move one complete chunk from the raw bytes to _buf; False when none is complete yet."""
        size_line, sep, rest = self._raw.partition(b"\r\n")
        if not sep:
            return False
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            self._raw = b""
            return False
        if len(rest) < size + 2:
            return False
        self._buf += rest[:size]
        self._raw = rest[size + 2:]
        return True

    def events(self):
        """(arrival perf_counter time, event): each `data:` line parsed (JSON dict, or "[DONE]"), until the
        server ends the stream. Chunk framing is skipped: an SSE line never holds a raw newline."""
        while True:
            while b"\n" in self._buf:
                line, _, self._buf = self._buf.partition(b"\n")
                line = line.strip()
                if line.startswith(b"data:"):
                    payload = line[5:].strip().decode("utf-8", errors="replace")
                    try:
                        yield time.perf_counter(), ("[DONE]" if payload == "[DONE]" else json.loads(payload))
                    except ValueError:
                        yield time.perf_counter(), {"unparsed": payload}
            if not self._read():
                return

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def environment(scratch: Path, device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A served program's environment: launch.environment for `device`, with the grader's `extra` variables."""
    return launch.environment(scratch, device=device, **(extra or {}))


def _answers(uds: str) -> bool:
    """Whether something answers HTTP on the socket (any status line counts: the app is being served)."""
    conn = UnixHTTPConnection(uds, timeout=2.0)
    try:
        conn.request("GET", "/health")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def start(learner_dir: Path, app: str, *, scratch: Path, env: dict[str, str] | None = None,
          device: str = "cpu") -> Server:
    """Launch uvicorn serving `app` ("module:attribute" of the learner's snapshot) on a socket in `scratch`;
    returns at once (see `wait_ready`). ServerFailed, with nothing started, where the same app never answered
    earlier in this grade (launch.hangs: a server that never comes up costs one start-up limit per grade)."""
    target, key = f"{app} under uvicorn", (str(Path(learner_dir).resolve()), f"{app} under uvicorn")
    if (hang := hangs.earlier(key, target)) is not None:
        raise ServerFailed(f"not run: {hang.described()}, so it was not started again in this grade; look for a "
                           "start-up that never finishes or a handler that never returns, fix it and grade again")
    scratch = Path(scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    uds, made = scratch / SOCKET_NAME, None
    if len(str(uds)) > _MAX_SOCKET_PATH:  # a long temp folder (TMPDIR, pytest's basetemp): a short one instead
        scratch = made = Path(tempfile.mkdtemp(prefix="infracourse-srv-",
                                               dir="/tmp" if os.path.isdir("/tmp") else None))
        uds = scratch / SOCKET_NAME
    if len(str(uds)) > _MAX_SOCKET_PATH:
        raise ValueError(f"socket path {uds} is longer than {_MAX_SOCKET_PATH} characters (a Unix socket's limit): "
                         "pass a shorter scratch folder")
    uds.unlink(missing_ok=True)
    learner_dir = Path(learner_dir).resolve()
    command = [sys.executable, "-s", "-m", "uvicorn", app, "--uds", str(uds), "--app-dir", str(learner_dir),
               "--no-access-log", "--log-level", "warning", "--timeout-graceful-shutdown", "1"]
    # its log cut past output.OUTPUT_LIMIT, the server killed
    proc = launch.start(command, scratch=scratch, snapshot=learner_dir, env=environment(scratch, device, env),
                        gpu=device == "cuda", log=scratch / LOG_NAME)
    proc.hang_key = key  # wait_ready remembers a server that never answered
    return Server(str(uds), proc, proc.capture.path, captured=proc.capture, made=made)


def wait_ready(server: Server, ready_timeout_s: float = 30.0) -> Server:
    """Poll until the server answers HTTP; ServerFailed (its log tail) when it exits or never answers."""
    started = time.perf_counter()
    while True:
        if not server.alive():
            raise ServerFailed(server._died("during start-up"))
        if os.path.exists(server.uds) and _answers(server.uds):
            server.started_s = time.perf_counter() - started
            return server
        if time.perf_counter() - started > ready_timeout_s:
            if getattr(server.proc, "hang_key", None) is not None:
                hangs.note(server.proc.hang_key, server.proc.hang_key[1], ready_timeout_s, "did not answer")
            raise ServerFailed(f"your server did not answer on its socket within {ready_timeout_s:g} s of its start; "
                               f"the end of its log:\n{server.log_tail()}")
        time.sleep(0.05)


def stop(server: Server) -> None:
    """Kill the server's whole process tree (the sandbox dies with it) and reap it."""
    server.proc.kill_tree()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if server.made is not None:
        shutil.rmtree(server.made, ignore_errors=True)


@contextmanager
def serve(learner_dir: Path, app: str = "server:app", *, scratch: Path, env: dict[str, str] | None = None,
          ready_timeout_s: float = 30.0, device: str = "cpu") -> Iterator[Server]:
    """A learner server for the duration of a `with` block: started, answered once, killed on exit. A server
    that died on its own inside the block (and the block raised nothing else) raises ServerFailed on exit."""
    server = start(learner_dir, app, scratch=scratch, env=env, device=device)
    try:
        wait_ready(server, ready_timeout_s)
        yield server
        server.require_alive("while the judge was using it")
    finally:
        stop(server)


# A learner's supervisor of a course service (weeks 21-24): the judge finds the service's processes in the
# learner's process tree, kills one, and clocks on its own clock when a new one answers. ------------------------
def course_services(server: Server, marker: str = "platform_service",
                    version_env: str = "INFRACOURSE_VERSION") -> list[dict]:
    """The course service processes under the learner's server (their command line names `marker`): pid,
    version (from the process's environment, "v1" when unset), the socket it serves (--uds), its start time."""
    import psutil

    out = []
    try:
        tree = psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.Error:
        return out
    for p in tree:
        try:
            cmd = p.cmdline()
            if p.status() == psutil.STATUS_ZOMBIE or not any(marker in a for a in cmd):
                continue
            uds = cmd[cmd.index("--uds") + 1] if "--uds" in cmd else ""
            out.append({"pid": p.pid, "version": p.environ().get(version_env) or "v1", "uds": uds,
                        "created": p.create_time()})
        except (psutil.Error, ValueError, IndexError):
            continue
    return out


def kill_and_clock(server: Server, victim: dict, *, after_s: float, window_s: float, out: dict,
                   marker: str = "platform_service") -> None:
    """(A thread's target.) After `after_s`, SIGKILL the course service `victim` (a course_services entry), then
    until `window_s` has passed, look for a new service process of the same version answering GET /health.
    Fills `out`: "killed" (perf_counter), "ready_s", "new" and "at_rest_s" (restart_at_rest) once one answers, or
    "error" if the kill failed."""
    import asyncio

    import psutil

    from infracourse.kit.platform_service import probe  # why: week 21's service kit, loaded by its checks only

    time.sleep(after_s)
    try:
        psutil.Process(victim["pid"]).kill()
    except psutil.Error as exc:
        out["error"] = str(exc)
        return
    killed = time.perf_counter()
    out["killed"] = killed
    while time.perf_counter() - killed < window_s:
        fresh = [s for s in course_services(server, marker) if s["pid"] != victim["pid"]
                 and s["version"] == victim["version"]]
        for s in fresh:
            if s["uds"] and asyncio.run(probe(s["uds"], "/health"))[0] == 200:
                out["ready_s"] = time.perf_counter() - killed
                out["new"] = s
                out["at_rest_s"] = restart_at_rest(out)
                return
        time.sleep(0.02)


def restart_at_rest(kill: dict) -> float | None:
    """kit.platform_service.restart_at_rest_s of a kill_and_clock record, read right when the new service
    answered /health: a report's figure, measured at the learner's own time with the same function, is held
    against this one (the same verdict whatever the load). None if the process is already gone."""
    from infracourse.kit.platform_service import restart_at_rest_s  # why: week 21's service kit, loaded by its checks only

    killed_at = time.time() - (time.perf_counter() - kill["killed"])  # the kill, on the epoch clock
    return restart_at_rest_s(kill["new"]["pid"], killed_at)
