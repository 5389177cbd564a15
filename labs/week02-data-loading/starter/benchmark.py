"""Week 2: sweep batch size, read method and loader workers; split every step into data wait, transfer and
compute; record the machine's resources; write the raw data. `python benchmark.py` writes results.csv.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch  # noqa: F401  (torch.cuda.synchronize on a GPU)

from infracourse.kit.data import device_utilisation, ensure_dataset, new_trainer, to_device, train_step  # noqa: F401
from loaders import make_loader  # noqa: F401

COLUMNS = ["read", "batch_size", "workers", "warmup", "steps", "samples_per_s", "step_ms", "data_ms",
           "transfer_ms", "compute_ms", "cpu_percent", "rss_mb", "disk_read_mb", "gpu_util"]
GRID = {"read": ["file", "packed"], "batch_size": [32, 128, 512], "workers": [0, 1, 2, 4]}
CHOSEN = {"read": "file", "batch_size": 32, "workers": 0}  # TODO(week02): the best row of your results.csv


def run_config(root: Path, read: str, batch_size: int, workers: int, *, warmup: int = 5, steps: int = 30,
               device: str | None = None, trainer=new_trainer) -> dict:
    """Train `steps` timed steps after `warmup` untimed ones; return one row of COLUMNS (times are means).

    Make the model and optimiser once, before the warm-up, with trainer(device) (the grader hands in the
    course's model, which records the steps it trains); make_loader for the batches, to_device for the copy
    and train_step for every step. The three parts of a step and the step itself are timed on the host clock;
    on a GPU, synchronise before every clock read.
    """
    # TODO(week02): warm-up steps, then the timed loop; psutil for cpu_percent, rss_mb and disk_read_mb.
    raise NotImplementedError("run_config(): time data wait, transfer and compute for each step")


def sweep(root: Path, configs: list[dict], out_csv: Path, *, warmup: int = 5, steps: int = 30,
          trainer=new_trainer) -> list[dict]:
    """Run every configuration ({read, batch_size, workers}), in the order given, passing `trainer` on to
    run_config, and write one CSV row (COLUMNS) each to out_csv."""
    # TODO(week02): csv.DictWriter(fieldnames=COLUMNS); one run_config per configuration.
    raise NotImplementedError("sweep(): run each configuration and write results.csv")


def main() -> None:
    configs = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    sweep(ensure_dataset(), configs, Path("results.csv"))


if __name__ == "__main__":
    main()
