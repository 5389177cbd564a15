"""Week 11 sweep: time ring_all_reduce over message sizes, in turns with the library's dist.all_reduce (the
control), write every timed call to sweep.csv (raw), fit the alpha-beta model to the ring's rows and print the
figures the report asks for.

    torchrun --nproc-per-node 2 sweep.py            # CPU, gloo: 1 KiB .. 4 MiB (graded)
    torchrun --nproc-per-node 2 sweep.py --cuda     # GPUs, NCCL: 1 KiB .. 1 GiB where memory allows (sweep_cuda.csv)
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import time

import torch
import torch.distributed as dist

from collectives import ring_all_reduce

WARMUP, REPS = 3, 25


def sizes(largest: int) -> list[int]:
    return [2 ** k for k in range(10, largest.bit_length())]  # 1 KiB, 2 KiB, ... largest (a power of two)


def time_all_reduce(nbytes: int, device: str) -> dict[str, list[float]]:
    """This rank's clock around each call, after a barrier so every rank starts together (warm-up excluded);
    ring_all_reduce and dist.all_reduce in turns, call by call, so both see the same machine."""
    x = torch.randn(nbytes // 4, device=device)
    samples = {"ring": [], "library": []}
    for rep in range(WARMUP + REPS):
        for impl, all_reduce in (("ring", ring_all_reduce), ("library", dist.all_reduce)):
            y = x.clone()
            dist.barrier()
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            all_reduce(y)
            if device == "cuda":
                torch.cuda.synchronize()  # NCCL work is asynchronous: wait for it inside the clock
            if rep >= WARMUP:
                samples[impl].append(time.perf_counter() - started)
    return samples


def fit(points: dict[int, float]) -> tuple[float, float]:
    """t = alpha + beta * bytes by least squares on relative errors (each residual over its size's median)."""
    ws = {s: 1 / t ** 2 for s, t in points.items()}
    sw = sum(ws.values())
    sx = sum(w * s for s, w in ws.items())
    sy = sum(w * points[s] for s, w in ws.items())
    sxx = sum(w * s * s for s, w in ws.items())
    sxy = sum(w * s * points[s] for s, w in ws.items())
    beta = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - beta * sx) / sw, beta


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()
    device = "cuda" if args.cuda else "cpu"
    if args.cuda:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        free = torch.cuda.mem_get_info()[0]
        largest = min(2 ** 30, 2 ** int(math.log2(free // 8)))  # x, its copy and buffers fit
    else:
        dist.init_process_group("gloo")
        largest = 4 * 2 ** 20
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for nbytes in sizes(largest):
        for impl, samples in time_all_reduce(nbytes, device).items():
            rows += [(world, impl, nbytes, rep, seconds) for rep, seconds in enumerate(samples)]
    if rank == 0:
        with open("sweep_cuda.csv" if args.cuda else "sweep.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["world_size", "impl", "bytes", "rep", "seconds"])
            writer.writerows(rows)
        points, library = {}, {}
        for _, impl, nbytes, _, seconds in rows:
            (points if impl == "ring" else library).setdefault(nbytes, []).append(seconds)
        points = {s: statistics.median(ts) for s, ts in points.items()}
        library = {s: statistics.median(ts) for s, ts in library.items()}
        alpha, beta = fit(points)
        largest_t = points[largest]
        algbw = largest / largest_t / 1e9
        busbw = algbw * 2 * (world - 1) / world
        print(f"{'bytes':>12} {'median us':>10} {'algbw GB/s':>10} {'busbw GB/s':>10} {'ring/library':>12}")
        for s, t in points.items():
            print(f"{s:>12} {t * 1e6:>10.1f} {s / t / 1e9:>10.3f} {s / t / 1e9 * 2 * (world - 1) / world:>10.3f} "
                  f"{t / library[s]:>12.2f}")
        print(f"alpha_us: {alpha * 1e6:.1f}\nbeta_ns_per_byte: {beta * 1e9:.4f}\n"
              f"crossover_bytes: {alpha / beta:.0f}\nalgbw_gbps: {algbw:.4f}\nbusbw_gbps: {busbw:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
