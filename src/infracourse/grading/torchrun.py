"""Judge side of the distributed labs: the learner's code runs as under torchrun, confined like the worker.

The same code runs multi-node. A world that torchrun must restart, or that runs on GPUs, runs under torchrun
itself; a one-shot CPU world runs under `infracourse.kit.rank_launcher`, which starts each rank as a fresh
interpreter with torchrun's environment and failure handling, without torchrun's agent (its own torch import
and elastic rendezvous: a 2-rank launch 1.8 s against 2.4 s on a loaded 2-core machine). The whole world runs
inside one sandbox, whose private network namespace has only a loopback, so every rank rendezvouses on
127.0.0.1. Each rank runs `infracourse.kit.rank_driver`, which imports the learner's module, calls one function
and saves what it returned (tensors, numbers, lists, dicts) to the scratch folder. The judge loads those files
with `weights_only=True` (no learner object is ever unpickled here) and treats them as evidence: graders compare
them with their own single-process references, never take a verdict from them.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from infracourse import launch
from infracourse.failures import LabCheckFailed
from infracourse.launch import hangs, output

RANK_FILE = "rank{rank}.pt"
RUNTIME_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS")
# frames of a fatal-signal stack that every abort shares: the signal's delivery, libc's abort, the process's start
NOT_THE_CAUSE = {"<unknown function>", "gsignal", "raise", "abort", "pthread_kill", "__libc_start_main", "_start"}
HANG_CAUSES = ("a collective that never completes (a rank that skips one, or ranks calling them in different orders "
               "or with different sizes), or a rank waiting on a message nobody sends")


class LaunchNotRun(LabCheckFailed):
    """An earlier launch of the same learner code overran its time limit in this grade, so this one was not
    started: a deadlock costs one time limit per grade, not one per check (launch.hangs)."""

    def __init__(self, hang: hangs.Hang):
        super().__init__(f"not run: {hang.described()} (launched under torchrun), so it was not started again "
                         f"in this grade; look for {HANG_CAUSES}, fix it and grade again")


@dataclass
class RanksRun:
    """What one torchrun launch left behind."""
    returncode: int
    outputs: list[Any]          # per rank: what the learner's function returned, None where the rank left nothing
    errors: list[str | None]    # per rank: the learner's traceback tail where the function raised
    probes: list[Any]           # per rank: what the course's probe recorded in that rank (evidence), or None
    log: str                    # torchrun's and the ranks' output, last 8000 characters
    wall_s: float               # the judge's own clock around the whole launch, start-up included
    timed_out: bool = False
    scratch: Path | None = field(default=None, repr=False)
    attempts: int = 1           # 2: the first launch lost a rank to a runtime signal and was launched again
    output_cut: bool = False    # the world printed past output.OUTPUT_LIMIT and was killed
    limit_s: float = 0.0        # the time limit it ran under
    not_run: str = ""           # why it was not started: an earlier launch of the same code hung (LaunchNotRun)
    native: str = ""            # the C++ frames of a rank that died by a runtime signal (native_stack)

    def died_by_signal(self) -> bool:
        """A rank died by a runtime signal (torchrun's account: SIGABRT, SIGSEGV, SIGBUS) and no rank raised a
        Python error. On a loaded 2-core machine gloo has aborted an honest rank this way about once in 20
        launches; at load 6-7 both launches of a grade aborted in 2 grades of 190 (docs/grading-times.md), where
        the grade stays `failed`."""
        return (not self.timed_out and not self.output_cut and self.returncode != 0 and not any(self.errors)
                and any(f"({name})" in self.log for name in RUNTIME_SIGNALS))

    def failure(self) -> str | None:
        """A message naming what went wrong, or None when every rank returned."""
        twice = " (launched twice: both times a rank died by a signal)" if self.attempts == 2 else ""
        if self.not_run:
            return self.not_run
        if self.output_cut:
            return f"the run printed too much; {output.CUT_NOTE}; last output:\n{self.log[-1500:]}"
        if self.timed_out:
            return (f"the run did not finish within its time limit ({self.limit_s:.0f} s): {HANG_CAUSES}; later "
                    f"launches of the same code in this grade are not started; last output:\n{self.log[-1500:]}")
        for rank, error in enumerate(self.errors):
            if error:
                return f"rank {rank} raised:\n{error}"
        missing = [r for r, out in enumerate(self.outputs) if out is None]
        if self.returncode != 0 or missing:
            native = [line for line in self.log.splitlines() if "terminate called" in line or "what():" in line]
            returned = (f"ranks {missing} returned nothing" if missing else
                        "every rank had saved its result, then a rank died")
            return (f"the launch exited with {self.returncode}{twice}; {returned}; "
                    + (f"a rank's native error: {' '.join(native[-2:])}; " if native else "")
                    + (f"its C++ stack: {self.native}; " if self.native else "")
                    + f"last output:\n{self.log[-1500:]}")
        return None


def native_stack(log: str, frames: int = 14) -> str:
    """The C++ frames of the thread that took the signal, of those the fatal-signal handler printed
    (kit.rank_driver turns it on; the first printed when none is marked), innermost first, the handler's and libc's own frames left out, each frame's
    function only (a stripped library's frames as ?(library), repeats once). Empty when the log holds none."""
    lines = log.splitlines()
    headers = [i for i, line in enumerate(lines)
               if any(line.startswith(f"{name}(") for name in RUNTIME_SIGNALS) and "Thread" in line]
    if not headers:
        return ""
    # torch prints every thread of the process; the one that took the signal runs fatalSignalHandler, the others
    # stacktraceSignalHandler (a gloo worker thread aborted while the main thread's stack, printed first, was Python)
    blocks = [lines[start + 1:end] for start, end in zip(headers, [*headers[1:], len(lines)])]
    aborted = next((n for n, block in enumerate(blocks)
                    if any("fatalSignalHandler" in line for line in block)
                    and not any("stacktraceSignalHandler" in line for line in block)), 0)
    header = headers[aborted]
    names: list[str] = []
    for line in lines[header + 1:]:
        line = line.strip()
        if line == "<omitting python frames>":
            names.append("(Python)")
            continue
        if not line.startswith("frame #"):
            break
        frame = line.split(":", 1)[1].strip()
        name = frame.split(" + 0x")[0].split(" (0x")[0].strip()
        library = frame.rsplit("/", 1)[-1].rstrip(")") if " in " in frame else ""
        if name == "<unknown function>" and not library.startswith("libc."):
            name = f"?({library})"  # a stripped library's frame: at least which library
        if name not in NOT_THE_CAUSE and "FatalSignalHandler" not in name and (not names or names[-1] != name):
            names.append(name)
    return " < ".join(names[:frames])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(module: str, function: str, *, learner_dir: Path, world_size: int, kwargs: dict | None = None,
                device: str = "cpu", probe: str = "", scratch: Path, max_restarts: int = 0,
                extra_env: dict[str, str] | None = None, stdout=None) -> launch.Launched:
    """Start `world_size` ranks calling `module.function(**kwargs)` from the learner's folder; returns the
    torchrun process (its whole tree dies with the sandbox). `probe` names a course module whose `install()`
    runs in each rank before the learner's import (counting collectives, say) and whose `report()` is saved.
    LaunchNotRun (a failed check) where an earlier launch of the same code hung in this grade."""
    target = f"{module}.{function}"
    key = (str(Path(learner_dir).resolve()), target)
    if (hang := hangs.earlier(key, target)) is not None:
        raise LaunchNotRun(hang)
    hangs.starting(target, f"{world_size} ranks under torchrun")
    out = scratch / "ranks"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    args_file = scratch / "args.pt"
    torch.save(kwargs or {}, args_file)
    confined = launch.confining()
    port = 29500 if confined else _free_port()  # inside the sandbox the loopback is the world's own
    driver = [str(Path(learner_dir).resolve()), module, function, str(args_file), str(out), probe]
    # torchrun's agent where it restarts a world, and on GPUs (the launcher is verified on CPU ranks only; the lent
    # GPU machines could not be started in the session that wrote it)
    if max_restarts or device == "cuda":
        command = [sys.executable, "-s", "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                   str(world_size), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--local-addr", "127.0.0.1", "--max-restarts", str(max_restarts), "--monitor-interval", "0.2",
                   "-m", "infracourse.kit.rank_driver", *driver]
    else:  # torchrun's environment and failure handling, without its agent (kit.rank_launcher)
        command = [sys.executable, "-s", "-m", "infracourse.kit.rank_launcher", str(world_size), str(port), *driver]
    env = launch.environment(scratch, device=device, **{"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
                                                        "NCCL_NVLS_ENABLE": "0", **(extra_env or {})})
    # the log beside the scratch, not in it: the world cannot see or replace it; cut past output.OUTPUT_LIMIT
    log = None if stdout is not None else scratch.parent / f"{scratch.name}.torchrun.log"
    streams = {} if stdout is None else {"stdout": stdout, "stderr": subprocess.STDOUT}
    proc = launch.start(command, scratch=scratch, snapshot=Path(learner_dir).resolve(), env=env,
                        gpu=device == "cuda", log=log, text=True, **streams)
    proc.hang_key = key  # collect() remembers a launch that overran its limit under this key
    return proc


def collect(proc: launch.Launched, *, scratch: Path, world_size: int, timeout_s: float,
            started: float | None = None) -> RanksRun:
    """Wait for a launch (killing its whole tree past `timeout_s`, and remembering that it hung: launch.hangs)
    and load what each rank saved."""
    started = started or time.perf_counter()
    timeout_s = hangs.limit(timeout_s)
    timed_out = False
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill_tree()
        log, _ = proc.communicate()
        if getattr(proc, "hang_key", None) is not None:
            hangs.note(proc.hang_key, proc.hang_key[1], timeout_s)
    wall = time.perf_counter() - started
    captured = getattr(proc, "capture", None)
    if captured is not None:
        captured.finish()
        log = captured.tail(8000)
    outputs, errors, probes = [], [], []
    for rank in range(world_size):
        saved = _load(scratch / "ranks" / RANK_FILE.format(rank=rank))
        outputs.append(saved.get("result") if saved and "result" in saved else None)
        errors.append(saved.get("error") if saved else None)
        probes.append(saved.get("probe") if saved else None)
    native = ""
    if proc.returncode not in (0, None) and captured is not None and captured.path.is_file():
        # the whole log: the handler's frames come before torchrun's summary, past the 8000 characters kept
        native = native_stack(captured.path.read_text(errors="replace"))
    return RanksRun(proc.returncode if proc.returncode is not None else -9, outputs, errors, probes,
                    (log or "")[-8000:], wall, timed_out, scratch, output_cut=bool(captured and captured.cut),
                    limit_s=timeout_s, native=native)


def run_ranks(module: str, function: str, *, learner_dir: Path, world_size: int, kwargs: dict | None = None,
              device: str = "cpu", probe: str = "", timeout_s: float = 60.0, scratch: Path | None = None,
              max_restarts: int = 0, extra_env: dict[str, str] | None = None) -> RanksRun:
    """Launch, wait, load: the common case of start_ranks + collect. A launch that lost a rank to a runtime
    signal with no Python error (RanksRun.died_by_signal) is launched once more, and the second run stands.
    One not started because the same code hung earlier in this grade is a run whose failure() says so."""
    scratch = Path(scratch or tempfile.mkdtemp(prefix="infracourse-ranks-"))
    for attempt in (1, 2):
        started = time.perf_counter()
        try:
            proc = start_ranks(module, function, learner_dir=learner_dir, world_size=world_size, kwargs=kwargs,
                               device=device, probe=probe, scratch=scratch, max_restarts=max_restarts,
                               extra_env=extra_env)
        except LaunchNotRun as refused:
            return RanksRun(-1, [None] * world_size, [None] * world_size, [None] * world_size, "", 0.0,
                            scratch=scratch, not_run=str(refused))
        run = collect(proc, scratch=scratch, world_size=world_size, timeout_s=timeout_s, started=started)
        run.attempts = attempt
        if not run.died_by_signal():
            break
    return run


def rank_processes(proc: subprocess.Popen) -> dict[int, int]:
    """Host pids of the live ranks of a launch, by rank (read from each process's environment), for a grader
    that kills one on purpose."""
    import psutil

    found: dict[int, int] = {}
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            if "infracourse.kit.rank_driver" not in " ".join(child.cmdline()):
                continue
            rank = child.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rank is not None and rank.isdigit():
            found[int(rank)] = child.pid
    return found


def _load(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        loaded = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # a rank file the learner's code tampered with is not evidence
        return {"error": f"its output file could not be read safely ({type(exc).__name__}: {exc})"}
    return loaded if isinstance(loaded, dict) else {"error": "its output file is not a rank record"}
