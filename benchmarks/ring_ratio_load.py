"""Week 11's ring/library time ratio against CPU load: is it a figure a sweep recorded at one load can be held to
at another? (issue 29; docs/grading-times.md has the runs.)

    python benchmarks/ring_ratio_load.py --runs 3 --busy 0 2 4 [--cpus 0,1]

Each run starts 2 gloo ranks (torchrun) of the reference solution's ring_all_reduce and dist.all_reduce, timed
in turns call by call at 1-4 MiB (3 warm-up + 25 calls a size, the sweep's and the grader's scheme), beside
`busy` spinning processes; `--cpus` pins the ranks and the spinners to those CPUs (a 2-core machine on a bigger
host). Prints one JSON line a run: the load average, and the ratio (ring over library, per-size statistic summed
over the sizes) by wall time and by the process's CPU time, each from the means and from the fastest calls.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RANK = r'''
import json, os, statistics, time
import torch, torch.distributed as dist
from collectives import ring_all_reduce
dist.init_process_group("gloo")
torch.set_num_threads(1)
B = [1 << 20, 2 << 20, 4 << 20]
wall = {"ring": {}, "library": {}}; cpu = {"ring": {}, "library": {}}
for nbytes in B:
    x = torch.randn(nbytes // 4)
    for rep in range(3 + 25):
        for impl, call in (("ring", ring_all_reduce), ("library", dist.all_reduce)):
            y = x.clone(); dist.barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            call(y)
            w1, c1 = time.perf_counter(), time.process_time()
            if rep >= 3:
                wall[impl].setdefault(nbytes, []).append(w1 - w0); cpu[impl].setdefault(nbytes, []).append(c1 - c0)
def ratio(d, stat):
    return round(sum(stat(d["ring"][s]) for s in B) / sum(stat(d["library"][s]) for s in B), 2)
if dist.get_rank() == 0:
    print(json.dumps({"wall_mean": ratio(wall, statistics.fmean), "wall_fastest": ratio(wall, min),
                      "cpu_mean": ratio(cpu, statistics.fmean), "cpu_fastest": ratio(cpu, min),
                      "library_4mib_ms": round(statistics.fmean(wall["library"][4 << 20]) * 1e3, 2)}))
dist.destroy_process_group()
'''


def spinners(n: int, cpus: str | None) -> list[subprocess.Popen]:
    prefix = ["taskset", "-c", cpus] if cpus else []
    return [subprocess.Popen(prefix + [sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2, 4], help="spinning processes beside the ranks")
    parser.add_argument("--cpus", default=None, help="pin everything to these CPUs (taskset list, e.g. 0,1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "collectives.py").write_text(
            (REPO / "labs/week11-collectives/solution/collectives.py").read_text())
        (Path(tmp) / "rank.py").write_text(RANK)
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{tmp}", "OMP_NUM_THREADS": "1"}
        prefix = ["taskset", "-c", args.cpus] if args.cpus else []
        for busy in args.busy:
            spin = spinners(busy, args.cpus)
            try:
                for _ in range(args.runs):
                    out = subprocess.run(prefix + [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                                   "2", "rank.py"], cwd=tmp, env=env, capture_output=True,
                                         text=True, timeout=300)
                    line = next((x for x in out.stdout.splitlines() if x.startswith("{")), None)
                    if line is None:
                        print(json.dumps({"busy": busy, "error": out.stderr[-400:]}), flush=True)
                        continue
                    print(json.dumps({"busy": busy, "cpus": args.cpus or "all", "load": round(os.getloadavg()[0], 1),
                                      **json.loads(line)}), flush=True)
            finally:
                for p in spin:
                    p.kill()


if __name__ == "__main__":
    main()
