"""How fast the learner's everyday commands answer: `python benchmarks/cli_speed.py [--runs N]`.

Each command runs as a fresh process (what a learner types) in a throw-away workspace with week07 unlocked.
Reported per command: median wall seconds, median CPU seconds (user + system of the child), and the same
for a bare `python -c pass` as the floor no command can go under. Wall time depends on what else the
machine is doing, so the load average is printed beside it; CPU time depends on it much less.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {"python -c pass": [sys.executable, "-c", "pass"],
            "--help": ["--help"], "--version": ["--version"], "status": ["status"], "hint 7": ["hint", "7"],
            "next": ["next"], "drill": ["drill", "--json", "--seed", "1", "-n", "5"],
            "selftest": ["selftest", "--json", "--seed", "1"]}  # no input: the self-test ends at once


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    cli = [sys.executable, "-m", "infracourse"]
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        env = {k: v for k, v in os.environ.items() if k != "INFRACOURSE_WORKSPACE"}
        subprocess.run(cli + ["init", str(ws)], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(cli + ["unlock", "7"], cwd=ws, env=env, check=True, stdout=subprocess.DEVNULL)
        print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {runs} runs each")
        print(f"{'command':16} {'wall median':>12} {'CPU median':>11}")
        for name, args in COMMANDS.items():
            argv = args if args[0] == sys.executable else cli + args  # `next` unlocks one more week per run
            timed(argv, ws, env)  # once unmeasured: a drill's first sitting compiles the workspace's question bank
            samples = [timed(argv, ws, env) for _ in range(runs)]
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            print(f"{name:16} {wall:11.3f}s {cpu:10.3f}s")


if __name__ == "__main__":
    main()
