"""Where a run's CPU goes, by kind of process: the sandboxed workers, the torchrun ranks, the judges, the served
models, the CLI. The suite is CPU-bound on CI's 2 cores, so its time is the sum of these, not of test durations.

    sudo python benchmarks/cpu_by_process.py --out /tmp/cpu -- python -m pytest -q -n 3 --dist loadgroup
    python benchmarks/cpu_by_process.py --summarise /tmp/cpu

A test's own duration cannot say it: a judge forked from the warm interpreter, a rank inside a sandbox's pid
namespace or a server killed with its group is never reaped by the test's process, so neither its resource usage
nor any per-test counter sees its CPU. The kernel's process accounting (acct(2), `accton`; root only) does: one
record per process at its exit, with its CPU time and pid, whatever namespace it ran in. A record holds only the
command's first 15 characters ("python3"), so a sampler reads each new process's command line from /proc every
50 ms while the run goes on (a process that lives less than that, and does no real work, stays unnamed).

Writes acct (the kernel's records) and commands.tsv (pid, command line) into --out; prints, per kind of process,
its CPU seconds, share and count, and per week the CPU of the processes whose command line names that week's
grade folder (infracourse-weekNN-...). Needs `accton` and `dump-acct` (Debian/Ubuntu: apt-get install acct).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

SAMPLE_S = 0.05
KINDS = (  # (kind, pattern of the command line), first match wins
    ("sandboxed worker", r"infracourse\.grading\.worker"),
    ("rank (rank_driver)", r"infracourse\.kit\.rank_driver"),
    ("rank launcher", r"infracourse\.kit\.rank_launcher"),
    ("torchrun agent", r"torch\.distributed\.run|torchrun"),
    ("judge (forked from the warm interpreter)", r"infracourse\.grading\.judges"),
    ("judge (fresh)", r"-m pytest .*infracourse\.grading\.plugin"),
    ("served app (uvicorn)", r"uvicorn"),
    ("infracourse CLI", r"-m infracourse\b|bin/infracourse\b"),
    ("pytest-xdist worker", r"exec\(eval\(sys\.stdin"),
    ("pytest (the suite)", r"-m pytest"),
    ("learner script", r"/learner/\S+\.py"),
)
RANK_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv", "pt_elastic")  # a rank's record, named by a thread


def record(out: Path, command: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    acct = out / "acct"
    acct.write_bytes(b"")
    subprocess.run(["accton", str(acct)], check=True)
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(out / "commands.tsv", stop), daemon=True)
    sampler.start()
    try:
        return subprocess.run(command).returncode
    finally:
        subprocess.run(["accton", "off"], check=False)
        stop.set()
        sampler.join()


def _sample(path: Path, stop: threading.Event) -> None:
    seen: set[int] = set()
    with path.open("w") as f:
        while not stop.is_set():
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in seen:
                    continue
                try:
                    line = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").strip()
                except OSError:
                    continue
                if line:  # empty while a fork has not exec'd yet: read again next time
                    seen.add(int(name))
                    f.write(f"{name}\t{line.decode(errors='replace')[:400]}\n")
            f.flush()
            time.sleep(SAMPLE_S)


def summarise(out: Path) -> str:
    commands = {}
    for line in (out / "commands.tsv").read_text(errors="replace").splitlines():
        pid, _, command = line.partition("\t")
        if pid.isdigit():
            commands[int(pid)] = command
    dump = subprocess.run(["dump-acct", str(out / "acct")], capture_output=True, text=True, check=True).stdout
    by_kind, count, by_week = collections.Counter(), collections.Counter(), collections.Counter()
    for row in dump.splitlines():
        fields = [f.strip() for f in row.split("|")]
        name, cpu_s, pid = fields[0], (float(fields[2]) + float(fields[3])) / 100, int(fields[9])  # clock ticks
        command = commands.get(pid, "")
        kind = next((k for k, pattern in KINDS if re.search(pattern, command)), None)
        if kind is None:
            kind = "rank (rank_driver)" if name in RANK_THREADS else f"other: {name}"
        by_kind[kind] += cpu_s
        count[kind] += 1
        week = re.search(r"infracourse-(week\d\d)-", command)
        by_week[week.group(1) if week else "(no grade folder in its command line)"] += cpu_s
    total = sum(by_kind.values()) or 1.0
    lines = [f"{total:,.0f} CPU-s in {sum(count.values())} processes", "", "CPU-s    share  processes  kind"]
    lines += [f"{s:8.1f} {s / total:6.1%} {count[k]:9d}  {k}" for k, s in by_kind.most_common() if s >= total / 1000]
    lines += ["", "CPU-s    share  week (its grades' named processes)"]
    lines += [f"{s:8.1f} {s / total:6.1%}  {w}" for w, s in by_week.most_common()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the records (with a command after --)")
    parser.add_argument("--summarise", type=Path, metavar="DIR", help="print the table of an earlier run's folder")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.summarise:
        print(summarise(args.summarise))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.out or not command:
        parser.error("give --out DIR -- COMMAND, or --summarise DIR")
    if os.geteuid() != 0:
        parser.error("process accounting needs root (accton)")
    code = record(args.out, command)
    print(summarise(args.out))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
