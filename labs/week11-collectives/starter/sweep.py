"""Week 11 sweep: time ring_all_reduce over message sizes, in turns with the library's dist.all_reduce (the
control), write every timed call to sweep.csv (raw), fit the alpha-beta model to the ring's rows and print the
figures the report asks for.

    torchrun --nproc-per-node 2 sweep.py            # CPU, gloo: 1 KiB .. 4 MiB (graded)
    torchrun --nproc-per-node 2 sweep.py --cuda     # GPUs, NCCL: 1 KiB .. 1 GiB where memory allows (sweep_cuda.csv)
"""
from __future__ import annotations

import argparse
import csv
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
    """{"ring": [...], "library": [...]}: REPS times each of ring_all_reduce and of dist.all_reduce on one fp32
    tensor of nbytes, on THIS rank's clock, after WARMUP untimed rounds. Time them in turns, call by call (a round
    = one ring call, then one library call), so that whatever else runs on the machine slows both alike: the
    grader compares the ring's time over the library's with its own. Before each call: a fresh copy of the
    input and a dist.barrier(); on a GPU, synchronise before reading the clock."""
    raise NotImplementedError("TODO: time ring_all_reduce and dist.all_reduce in turns")


def fit(points: dict[int, float]) -> tuple[float, float]:
    """(alpha, beta) of t = alpha + beta * bytes fitted to {bytes: median seconds} by least squares on relative
    errors: minimise sum(((alpha + beta * s - t) / t) ** 2)."""
    raise NotImplementedError("TODO: the weighted least-squares fit")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()
    device = "cuda" if args.cuda else "cpu"
    if args.cuda:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        largest = 2 ** 30  # TODO: less where the GPU's free memory does not hold the tensor and its buffers
    else:
        dist.init_process_group("gloo")
        largest = 4 * 2 ** 20
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for nbytes in sizes(largest):
        for impl, samples in time_all_reduce(nbytes, device).items():
            rows += [(world, impl, nbytes, rep, seconds) for rep, seconds in enumerate(samples)]
    if rank == 0:
        # TODO: write rows to sweep.csv (sweep_cuda.csv with --cuda), header world_size,impl,bytes,rep,seconds;
        # from the ring's rows, print per size the median time, algbw and busbw, then alpha_us,
        # beta_ns_per_byte, crossover_bytes, and algbw_gbps / busbw_gbps at the largest size.
        raise NotImplementedError("TODO: write the CSV and print the figures")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
