"""Judge side of the serving labs: the learner's HTTP server runs under uvicorn, confined like the worker.

    with serve(learner.root, "server:app", scratch=tmp, env={"INFRACOURSE_SERVE": "..."}) as server:
        status, headers, body = server.request("GET", "/health")
        records, duration_s = server.load(specs, concurrency=8)     # kit.loadgen over the server's socket
        server.alive(), server.log_tail()

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
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from infracourse import sandbox
from infracourse.grading.torchrun import kill_tree
from infracourse.guard import LabCheckFailed

SOCKET_NAME = "server.sock"
LOG_NAME = "server.log"
_MAX_SOCKET_PATH = 100  # AF_UNIX paths hold 107 bytes on Linux; keep a margin


class ServerFailed(LabCheckFailed):
    """The learner's server did not start, or died while the judge was using it (the message has its log)."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


@dataclass
class Server:
    """A running learner server: its socket, its process (the sandbox's) and its log file."""
    uds: str
    proc: subprocess.Popen
    log_path: Path
    base_url: str = "http://localhost"
    started_s: float = field(default=0.0)  # seconds from launch until it first answered

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def require_alive(self, what: str = "") -> None:
        """ServerFailed with the log's tail when the server has exited."""
        if not self.alive():
            raise ServerFailed(f"your server exited (code {self.proc.returncode}){' ' + what if what else ''}; "
                               f"the end of its log:\n{self.log_tail()}")

    def request(self, method: str, path: str, body: dict | None = None, *,
                timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        """One plain HTTP request over the socket: (status, headers lower-cased, body bytes). A JSON `body` is
        sent with its Content-Type. Connection errors raise (OSError, http.client.HTTPException)."""
        conn = _UnixHTTPConnection(self.uds, timeout_s)
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

    def load(self, specs: Sequence, **kwargs):
        """kit.loadgen.run_load against this server (same keyword arguments, `uds` filled in):
        (records in spec order, duration_s on the judge's clock)."""
        from infracourse.kit.loadgen import run_load

        return run_load(specs, uds=self.uds, base_url=self.base_url, **kwargs)


def _environment(scratch: Path, device: str, extra: dict[str, str] | None) -> dict[str, str]:
    from infracourse.grading.remote import _ENV_KEEP, _engine_path

    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    env.update(HOME=str(scratch), TMPDIR=str(scratch), PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=_engine_path(),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), INFRACOURSE_DEVICE=device)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def _answers(uds: str) -> bool:
    """Whether something answers HTTP on the socket (any status line counts: the app is being served)."""
    conn = _UnixHTTPConnection(uds, timeout=2.0)
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
    returns at once (see `wait_ready`)."""
    scratch = Path(scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    uds = scratch / SOCKET_NAME
    if len(str(uds)) > _MAX_SOCKET_PATH:
        raise ValueError(f"socket path {uds} is longer than {_MAX_SOCKET_PATH} characters (a Unix socket's limit): "
                         "pass a shorter scratch folder")
    uds.unlink(missing_ok=True)
    learner_dir = Path(learner_dir).resolve()
    command = [sys.executable, "-s", "-m", "uvicorn", app, "--uds", str(uds), "--app-dir", str(learner_dir),
               "--no-access-log", "--log-level", "warning", "--timeout-graceful-shutdown", "1"]
    if sandbox.status().available:
        command = sandbox.wrap(command, snapshot=learner_dir, scratch=scratch, gpu=device == "cuda")
    log_path = scratch / LOG_NAME
    with log_path.open("w") as log:  # the child keeps its own handle
        proc = subprocess.Popen(command, env=_environment(scratch, device, env), cwd=scratch, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return Server(str(uds), proc, log_path)


def wait_ready(server: Server, ready_timeout_s: float = 30.0) -> Server:
    """Poll until the server answers HTTP; ServerFailed (its log tail) when it exits or never answers."""
    started = time.perf_counter()
    while True:
        if not server.alive():
            raise ServerFailed(f"your server exited during start-up (code {server.proc.returncode}); the end of "
                               f"its log:\n{server.log_tail()}")
        if os.path.exists(server.uds) and _answers(server.uds):
            server.started_s = time.perf_counter() - started
            return server
        if time.perf_counter() - started > ready_timeout_s:
            raise ServerFailed(f"your server did not answer on its socket within {ready_timeout_s:g} s of its start; "
                               f"the end of its log:\n{server.log_tail()}")
        time.sleep(0.05)


def stop(server: Server) -> None:
    """Kill the server's whole process tree (the sandbox dies with it) and reap it."""
    kill_tree(server.proc)
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


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
