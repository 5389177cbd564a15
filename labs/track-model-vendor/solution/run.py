"""The project's one run command: `python run.py --out raw` (CPU: 4 ranks over gloo; `--device cuda` for NCCL).

It measures, on the course's routing traces (infracourse.kit.moe.case):
  raw/baseline.json   the dense single-process MoE (time), the routing statistics of the fixed skewed trace, and
                      the expert-parallel layer with expert e on rank e // 2: per-rank token rows and time
  raw/optimised.json  the same layer on the EPLB placement (replicated hot experts): rows and time
  raw/profile.json    a profile table of one expert-parallel forward on rank 0 (torch.profiler, self time per op)
  raw/failure.json    the failure case: a capacity sweep on the skewed trace, drops and the output's error
Every rank runs the same ep_moe; rank 0 gathers and writes the files.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe  # noqa: E402
from infracourse.kit import moe as kit  # noqa: E402  (the course's traces: the same ones the grader uses)

FACTORS = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0]


class Expert(torch.nn.Module):
    def __init__(self, w_in, w_out):
        super().__init__()
        self.w_in, self.w_out = w_in, w_out

    def forward(self, rows):
        return F.gelu(rows @ self.w_in) @ self.w_out


def timed(fn, reps, device):
    """Median wall time of `reps` calls after one warm-up; a barrier before each so every rank starts together."""
    fn()
    samples = []
    for _ in range(reps):
        dist.barrier()
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - started)
    return result, statistics.median(samples), samples


def gathered(value):
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, value)
    return found


def rank_main(rank, world, port, out, device, reps):
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    c = kit.case(kit.FIXED_SEED, "skewed", world=world)
    x, logits = c["x"][rank].to(device), c["logits"][rank].to(device)

    def layer(placement, capacity=None):
        experts = [Expert(c["w_in"][e].to(device), c["w_out"][e].to(device)) for e in placement[rank]]
        return lambda: moe.ep_moe(x, logits, experts, placement, kit.TOP_K, capacity)

    contiguous = kit.contiguous_placement(kit.EXPERTS, world)
    free_ref = kit.dense_moe(c, kit.TOP_K, None)
    stats = moe.routing_stats(free_ref["expert"].reshape(-1, kit.TOP_K), kit.EXPERTS, world)
    eplb = moe.eplb_placement(stats["tokens_per_expert"], world, kit.slots_for(world))

    before, before_s, before_samples = timed(layer(contiguous), reps, device)
    after, after_s, after_samples = timed(layer(eplb), reps, device)
    # the profile: one forward of the contiguous (baseline) layer, rank 0 recording
    run = layer(contiguous)
    dist.barrier()
    if rank == 0:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                    + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])) as prof:
            run()
    else:
        run()
    # the failure case: the same trace with a capacity per expert and sending rank
    outs_free = torch.cat([t for t in gathered(before["out"].cpu())])
    sweep = []
    for factor in FACTORS:
        capacity = kit.capacity_for(kit.TOKENS, kit.TOP_K, kit.EXPERTS, factor)
        result = layer(contiguous, capacity)()
        outs = torch.cat(gathered(result["out"].cpu()))
        dropped = sum(gathered(result["dropped"]))
        sweep.append({"capacity_factor": factor, "capacity": capacity, "dropped": dropped,
                      "drop_fraction": dropped / (world * kit.TOKENS * kit.TOP_K),
                      "relative_error": float(torch.linalg.norm(outs - outs_free) / torch.linalg.norm(outs_free))})
    loads_before, loads_after = gathered(before["load"]), gathered(after["load"])
    times_before, times_after = gathered(before_samples), gathered(after_samples)
    if rank == 0:
        dense = lambda: moe.dense_moe(c["x"][0], c["logits"][0], c["w_in"], c["w_out"], kit.TOP_K, None)  # noqa: E731
        dense_samples = []
        for _ in range(reps):
            started = time.perf_counter()
            dense()
            dense_samples.append(time.perf_counter() - started)
        rank_rows = lambda loads: [sum(row) for row in loads]  # noqa: E731
        common = {"trace": "skewed", "seed": kit.FIXED_SEED, "world": world, "tokens_per_rank": kit.TOKENS,
                  "experts": kit.EXPERTS, "top_k": kit.TOP_K, "d_model": kit.D_MODEL, "device": device,
                  "backend": backend, "reps": reps, "torch": torch.__version__}
        write(out / "baseline.json", {**common, "placement": contiguous, "routing_stats": stats,
                                      "dense_rank0_seconds": dense_samples, "ep_seconds_per_rank": times_before,
                                      "rows_per_slot": loads_before, "rows_per_rank": rank_rows(loads_before),
                                      "max_rank_rows": max(rank_rows(loads_before))})
        write(out / "optimised.json", {**common, "placement": eplb, "ep_seconds_per_rank": times_after,
                                       "rows_per_slot": loads_after, "rows_per_rank": rank_rows(loads_after),
                                       "max_rank_rows": max(rank_rows(loads_after))})
        table = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        write(out / "profile.json", {"what": "one expert-parallel forward on rank 0 (contiguous placement)",
                                     "rows": [{"name": e.key, "calls": e.count,
                                               "self_ms": e.self_cpu_time_total / 1e3,
                                               "total_ms": e.cpu_time_total / 1e3} for e in table[:25]]})
        write(out / "failure.json", {**common, "what": "capacity per expert and sending rank on the skewed trace",
                                     "rows": sweep})
    dist.barrier()
    dist.destroy_process_group()


def write(path, data):
    path.write_text(json.dumps(data, indent=1) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="raw")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(rank_main, args=(args.world, port, out.resolve(), args.device, args.reps), nprocs=args.world, join=True)
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} in {out}")


if __name__ == "__main__":
    main()
