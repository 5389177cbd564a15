"""The one place that knows the hardware: tier, device fingerprint, and calibrated ceilings.

Performance targets are fractions of ceilings measured on the learner's own device (copy bandwidth,
matmul throughput per dtype), so one lab is fair on an H200, an A100 and a laptop GPU. Ceilings are
measured once per device and cached under the user's cache folder, keyed by the device fingerprint.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infracourse import bench

CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class Hardware:
    tier: str  # "cpu", "cuda" or "multi-gpu"
    gpu_count: int
    gpu_name: str | None
    gpu_memory_gib: float | None
    sm_count: int | None
    l2_bytes: int | None
    cuda: str | None
    driver: str | None
    python: str
    torch: str | None
    triton: str | None
    cpu: str
    cpu_count: int

    def satisfies(self, need: str) -> bool:
        if need == "cpu":
            return True
        if need == "cuda":
            return self.gpu_count >= 1
        if need.startswith("multi-gpu:"):
            return self.gpu_count >= int(need.split(":", 1)[1])
        if need == "docker":
            return container_engine() is not None
        if need == "k8s":
            return kubernetes_cluster() is not None
        if need == "multi-node":
            return multi_node() is not None
        if need == "mlu":
            return mlu_count() > 0
        raise ValueError(f"unknown hardware need {need!r}")

    def missing(self, need: str) -> str:
        """Why a check with this need is blocked here ('' when it can run)."""
        if self.satisfies(need):
            return ""
        if need == "cuda":
            return "needs a CUDA GPU; this machine has none (tier cpu)"
        if need == "docker":
            return ("needs a container engine that runs (docker or podman answering `info`); this machine has "
                    "none: to be verified where one runs")
        if need == "k8s":
            return ("needs a reachable Kubernetes cluster (`kubectl` with a context whose API server answers "
                    "/readyz); this machine has none: to be verified where one runs")
        if need == "multi-node":
            return ("needs several machines in one job (a Slurm allocation of 2+ nodes, or torchrun's "
                    "MASTER_ADDR and NNODES >= 2 set); this is one machine: to be verified on a cluster")
        if need == "mlu":
            return ("needs a Cambricon MLU (torch_mlu with a device); this machine has none: to be verified on "
                    "an MLU, never replaced by a simulated figure")
        n = need.split(":", 1)[1]
        return f"needs {n} CUDA GPUs; this machine has {self.gpu_count}"

    @property
    def device_name(self) -> str:
        return self.gpu_name or f"cpu ({self.cpu})"

    def fingerprint(self) -> str:
        """Stable id of this device + software stack: calibration is cached under it."""
        key = json.dumps([self.gpu_name, self.gpu_count, self.gpu_memory_gib, self.driver, self.cuda,
                          self.torch, self.cpu, self.cpu_count], sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        return asdict(self) | {"fingerprint": self.fingerprint()}


# The toolchain the labs were proven with (reference solutions and honest variants graded complete): on CPU
# torch 2.13 (CPU build) + triton 3.6.0 in its interpreter, on the H200 torch 2.11 (cu130) + triton 3.6.0.
# [lowest, first excluded) per package; pyproject.toml declares the same ranges. `infracourse doctor` warns
# outside them: a newer Triton has removed interpreter APIs and changed numerics before.
PROVEN = {"torch": ("2.11", "2.14"), "triton": ("3.6", "3.7")}


def cpu_contention() -> float:
    """How many runnable tasks each core had over the last minute (the 1-minute load average per core), at
    least 1: a wall-clock phase that needs the CPU takes about this much longer than on an idle machine. The
    kernel's figure, so the learner's code cannot lower it (only add to it, by slowing itself)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


_SCHEDSTAT_FDS: dict[tuple[int, int], int] = {}  # (pid, native thread id) -> its open /proc/thread-self/schedstat


def thread_run_queue_wait() -> float:
    """Seconds the calling thread has so far spent runnable but waiting for a CPU (the kernel's schedstat, its
    second field), 0.0 where the kernel does not keep it. What load on a shared machine adds to a wall-clock
    interval of this thread, measured rather than guessed from the load average (which lags a burst by a
    minute); the thread's own code can raise it only by making the machine busier, never lower it. A few
    microseconds a read: the file stays open per thread (keyed by pid too, so a forked child opens its own;
    a file left by a thread that ended, whose id a new thread reuses, is opened again)."""
    key = (os.getpid(), threading.get_native_id())
    for _ in range(2):
        fd = _SCHEDSTAT_FDS.get(key)
        try:
            if fd is None:
                fd = _SCHEDSTAT_FDS[key] = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            return int(os.pread(fd, 128, 0).split()[1]) / 1e9
        except (ValueError, IndexError):
            return 0.0
        except OSError:
            if fd is None:
                return 0.0  # no schedstat here
            _SCHEDSTAT_FDS.pop(key, None)
            os.close(fd)
    return 0.0


def _release(version: str) -> tuple[int, ...]:
    """(2, 13, 0) for '2.13.0+cpu' or '2.13.0.dev20260101'."""
    import re

    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:  # '0rc1': the release ends here
            break
    return tuple(parts)


def toolchain_warnings(hw: "Hardware") -> list[str]:
    """One line per installed package outside the range the labs were proven with (PROVEN), and one when no
    C compiler is on PATH (week 1 builds a C loop)."""
    import shutil

    # why: kit.data imports this module inside a week's sandbox, whose kit view may lack kit.native
    from infracourse.kit.native import NO_C_COMPILER

    warnings = [] if shutil.which("cc") else [NO_C_COMPILER]
    for name, (low, high) in PROVEN.items():
        version = getattr(hw, name)
        if version is None:
            continue
        if not _release(low) <= _release(version) < _release(high):
            warnings.append(f"{name} {version} is outside the range the labs were proven with (>={low},<{high}): "
                            f"graders may fail correct kernels; pip install \"{name}>={low},<{high}\"")
    return warnings


def _answers(command: list[str], timeout_s: float = 10) -> bool:
    import shutil
    import subprocess

    if shutil.which(command[0]) is None:
        return False
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout_s).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=None)
def container_engine() -> str | None:
    """The container engine whose daemon (or rootless runtime) answers here: 'docker' or 'podman', else None.
    An installed client with no daemon behind it cannot build an image, so it does not count."""
    return next((engine for engine in ("docker", "podman") if _answers([engine, "info"])), None)


@functools.lru_cache(maxsize=None)
def kubernetes_cluster() -> str | None:
    """The current kubectl context when its API server answers /readyz, else None."""
    import subprocess

    if not _answers(["kubectl", "get", "--raw", "/readyz"], timeout_s=15):
        return None
    done = subprocess.run(["kubectl", "config", "current-context"], capture_output=True, text=True)
    return done.stdout.strip() or "default"


def multi_node() -> str | None:
    """What says this process runs in a job of several machines (Slurm nodes, or torchrun's node count), else
    None. One machine with many GPUs is multi-gpu:N, not multi-node."""
    env = os.environ
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "NNODES", "PET_NNODES"):
        if env.get(key, "").isdigit() and int(env[key]) >= 2:
            return f"{key}={env[key]}"
    return None


@functools.lru_cache(maxsize=None)
def mlu_count() -> int:
    """Cambricon MLUs visible through torch_mlu (0 where torch_mlu is not installed, as on every machine here)."""
    try:
        import torch_mlu  # noqa: F401  (registers torch.mlu)
        import torch
    except Exception:
        return 0
    try:
        return int(torch.mlu.device_count())
    except Exception:
        return 0


def _module_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:  # a broken install is reported as missing, not raised
        return None
    return getattr(module, "__version__", "unknown")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


def detect() -> Hardware:
    """Inspect this machine. Imports torch (about a second), nothing is cached."""
    torch_version = _module_version("torch")
    gpu_count, name, mem, sms, l2, cuda = 0, None, None, None, None, None
    if torch_version:
        import torch

        if torch.cuda.is_available():
            gpu_count = torch.cuda.device_count()
            props = torch.cuda.get_device_properties(0)
            name, mem, sms = props.name, round(props.total_memory / 2**30, 1), props.multi_processor_count
            l2 = getattr(props, "L2_cache_size", None)
            cuda = torch.version.cuda
    tier = "cpu" if gpu_count == 0 else ("cuda" if gpu_count == 1 else "multi-gpu")
    return Hardware(
        tier=tier, gpu_count=gpu_count, gpu_name=name, gpu_memory_gib=mem, sm_count=sms, l2_bytes=l2,
        cuda=cuda, driver=_driver_version() if gpu_count else None,
        python=sys.version.split()[0], torch=torch_version, triton=_module_version("triton"),
        cpu=_cpu_model(), cpu_count=os.cpu_count() or 1,
    )


# ---------------------------------------------------------------- calibration
@dataclass
class Ceilings:
    """Rates measured on this device: what 100 % means for its performance checks."""

    device: str
    copy_gbps: float  # device-to-device copy, bytes read + written per second / 1e9
    matmul_tflops: dict[str, float] = field(default_factory=dict)  # dtype name -> TFLOP/s at a large square size
    measured_at: str = ""
    seconds: float = 0.0
    version: int = CALIBRATION_VERSION


def cache_dir() -> Path:
    base = os.environ.get("INFRACOURSE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "infracourse")
    return Path(base)


def calibration_path(hw: Hardware) -> Path:
    return cache_dir() / "calibration" / f"{hw.fingerprint()}.json"


def cached_ceilings(hw: Hardware) -> Ceilings | None:
    try:
        data = json.loads(calibration_path(hw).read_text())
        ceilings = Ceilings(**data)
    except (OSError, ValueError, TypeError):
        return None  # missing or from an older format: measure again
    return ceilings if ceilings.version == CALIBRATION_VERSION else None


def calibrate(hw: Hardware, *, force: bool = False) -> Ceilings:
    """Measure copy bandwidth and matmul throughput on GPU 0 (cached per device fingerprint)."""
    if not force and (cached := cached_ceilings(hw)) is not None:
        return cached
    if hw.gpu_count == 0:
        raise RuntimeError("calibration needs a CUDA GPU: CPU timings never stand in for GPU ceilings")
    import time

    import torch

    start = time.perf_counter()
    n = 1 << 28  # 1 GiB of fp32 each way: far larger than any L2
    src = torch.empty(n, device="cuda", dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    copy = bench.measure(lambda: dst.copy_(src), warmup=3, reps=20, flush_l2=False)
    copy_gbps = 2 * n * 4 / copy.median_s / 1e9
    del src, dst
    rates = {}
    for name, dtype, size in (("float32", torch.float32, 4096), ("tf32", torch.float32, 8192),
                              ("float16", torch.float16, 8192), ("bfloat16", torch.bfloat16, 8192)):
        a = torch.randn(size, size, device="cuda", dtype=dtype)
        b = torch.randn(size, size, device="cuda", dtype=dtype)
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        t = bench.measure(lambda: a @ b, warmup=2, reps=10, flush_l2=False)
        rates[name] = 2 * size**3 / t.median_s / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    ceilings = Ceilings(device=hw.device_name, copy_gbps=copy_gbps, matmul_tflops=rates,
                        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"), seconds=time.perf_counter() - start)
    path = calibration_path(hw)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(ceilings), indent=1))
    tmp.replace(path)  # atomic: a killed calibration never leaves half a file
    return ceilings
