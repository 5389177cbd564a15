"""Week 2: sweep batch size, read method and loader workers; split every step into data wait, transfer and
compute; record the machine's resources; write the raw data (reference solution).

`python benchmark.py` runs the whole grid and writes results.csv, one row per configuration.
"""
from __future__ import annotations

import csv
import itertools
import time
from pathlib import Path

import psutil
import torch

from infracourse.kit.data import device_utilisation, ensure_dataset, new_trainer, to_device, train_step
from loaders import make_loader

COLUMNS = ["read", "batch_size", "workers", "warmup", "steps", "samples_per_s", "step_ms", "data_ms",
           "transfer_ms", "compute_ms", "cpu_percent", "rss_mb", "disk_read_mb", "gpu_util"]
GRID = {"read": ["file", "packed"], "batch_size": [32, 128, 512], "workers": [0, 1, 2, 4]}
CHOSEN = {"read": "packed", "batch_size": 512, "workers": 0}  # the best row of results.csv on this machine


def _endless(loader):
    """Epochs back to back, so a run may take more steps than one epoch holds."""
    while True:
        yield from loader


def _tree_rss_mb(process: psutil.Process) -> float:
    """Resident memory of this process and its loader workers (children), in MiB."""
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def run_config(root: Path, read: str, batch_size: int, workers: int, *, warmup: int = 5, steps: int = 30,
               device: str | None = None, trainer=new_trainer) -> dict:
    """Train `steps` timed steps after `warmup` untimed ones; return one row of COLUMNS (times are means)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model, optimizer = trainer(device)  # one model per configuration, made before its warm-up
    batches = _endless(make_loader(root, read, batch_size, workers))
    for _ in range(warmup):  # starts the workers, fills their prefetch queues, warms the allocator
        train_step(model, optimizer, *to_device(next(batches), device))
    sync()

    process = psutil.Process()
    disk_before = psutil.disk_io_counters()
    psutil.cpu_percent(None)  # starts the CPU-time window that the call after the loop closes
    data = transfer = compute = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(batches)  # data wait: the step is blocked until the loader has a batch ready
        t1 = time.perf_counter()
        images, labels = to_device(batch, device)
        sync()  # the copy is asynchronous from pinned memory: without this wait it would land in compute
        t2 = time.perf_counter()
        train_step(model, optimizer, images, labels)
        sync()
        t3 = time.perf_counter()
        data, transfer, compute = data + t1 - t0, transfer + t2 - t1, compute + t3 - t2
    wall = time.perf_counter() - start
    disk_after = psutil.disk_io_counters()
    utilisation = device_utilisation()
    return {
        "read": read, "batch_size": batch_size, "workers": workers, "warmup": warmup, "steps": steps,
        "samples_per_s": batch_size * steps / wall,
        "step_ms": wall / steps * 1e3,  # measured on its own: the three parts must add up to it
        "data_ms": data / steps * 1e3, "transfer_ms": transfer / steps * 1e3, "compute_ms": compute / steps * 1e3,
        "cpu_percent": psutil.cpu_percent(None),  # all cores, loader workers included
        "rss_mb": _tree_rss_mb(process),
        "disk_read_mb": (disk_after.read_bytes - disk_before.read_bytes) / 2**20 if disk_before else "",
        "gpu_util": "" if utilisation is None else utilisation,
    }


def sweep(root: Path, configs: list[dict], out_csv: Path, *, warmup: int = 5, steps: int = 30,
          trainer=new_trainer) -> list[dict]:
    """Run every configuration ({read, batch_size, workers}) and write one CSV row each to out_csv."""
    rows = []
    with open(out_csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for config in configs:
            rows.append(run_config(root, **config, warmup=warmup, steps=steps, trainer=trainer))
            writer.writerow(rows[-1])
            fh.flush()  # rows measured so far survive a crash in a later configuration
    return rows


def main() -> None:
    torch.set_num_threads(1)  # the model is tiny: a second intra-op thread only fights the loader workers
    configs = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    rows = sweep(ensure_dataset(), configs, Path("results.csv"))
    for row in sorted(rows, key=lambda r: -r["samples_per_s"]):
        print(f"{row['read']:>6} b={row['batch_size']:<4} w={row['workers']}  {row['samples_per_s']:9.0f} samples/s  "
              f"data {row['data_ms']:7.2f}  transfer {row['transfer_ms']:6.2f}  compute {row['compute_ms']:6.2f} ms  "
              f"cpu {row['cpu_percent']:5.1f}%  rss {row['rss_mb']:6.0f} MiB")


if __name__ == "__main__":
    main()
