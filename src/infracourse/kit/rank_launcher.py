"""A one-shot world of ranks started as torchrun starts them, by a launcher that does not import torch.

`python -m infracourse.kit.rank_launcher N PORT <rank_driver arguments>` runs inside the sandbox where
`python -m torch.distributed.run ... -m infracourse.kit.rank_driver <arguments>` would (grading.torchrun.start_ranks,
for a launch with no restarts). torchrun's agent imports torch (about a second of CPU) and sets up its elastic
rendezvous before it starts the ranks; this launcher imports neither. Each rank is a fresh interpreter, as under
torchrun (its own random seeds and str-hash salt: a learner's code that assumes every rank iterates a set of
names in the same order fails here as on a cluster), with the environment torchrun gives a worker (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, the TORCHELASTIC_* variables), so init_process_group("gloo") and
env:// work unchanged; rank 0 holds the rendezvous store, as under a plain env:// launch. Like torchrun's agent,
the launcher waits for the ranks and, when one fails, stops the others (SIGTERM, then SIGKILL after a grace
period) and exits 1 after saying which rank failed and how: a signal by its name, "(SIGABRT)", which
RanksRun.died_by_signal reads. A 2-rank launch took a median 1.8 s against torchrun's 2.4 s on a loaded 2-core
machine (forking the ranks from one interpreter that imported torch took 1.1 s, but forked ranks share the
hash salt and the random state, which torchrun's never do).

A world that torchrun must restart (--max-restarts, week 14's recovery) still runs under torchrun itself, and
so does a world on GPUs until this launcher has been graded on one (NCCL with rank 0 holding the store).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

STOP_GRACE_S = 5.0  # torchrun's agent gives the surviving workers a grace period after SIGTERM too
POLL_S = 0.02


def rank_environment(rank: int, world: int, port: int) -> dict[str, str]:
    """The variables torchrun's agent sets for worker `rank` of a one-node world that is never restarted."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
            "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False"}


def _described(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


def _stop(ranks: dict[int, subprocess.Popen]) -> None:
    """SIGTERM the ranks still running, then SIGKILL those that outlive the grace period."""
    running = [p for p in ranks.values() if p.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for proc in running:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def main(argv: list[str]) -> int:
    world, port, driver_args = int(argv[0]), int(argv[1]), argv[2:]
    command = [sys.executable, "-s", "-m", "infracourse.kit.rank_driver", *driver_args]
    ranks = {rank: subprocess.Popen(command, env={**os.environ, **rank_environment(rank, world, port)})
             for rank in range(world)}
    for sig in (signal.SIGTERM, signal.SIGINT):  # stopped from outside: stop the ranks too, as torchrun does
        signal.signal(sig, lambda number, _frame: (_stop(ranks), os._exit(128 + number)))
    failed = []
    while not failed and any(p.poll() is None for p in ranks.values()):
        failed = [f"rank {rank} (pid {p.pid}) {_described(p.returncode)}" for rank, p in ranks.items()
                  if p.returncode not in (None, 0)]
        if not failed:
            time.sleep(POLL_S)
    failed = failed or [f"rank {rank} (pid {p.pid}) {_described(p.returncode)}" for rank, p in ranks.items()
                        if p.returncode != 0]
    if failed:
        _stop(ranks)
        print(f"infracourse rank launcher: {'; '.join(failed)}; the other ranks were stopped", file=sys.stderr,
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
