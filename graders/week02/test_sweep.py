"""Week 2 raw data: the learner's sweep, re-run on a reduced grid, covers every configuration, splits each
step into data wait, transfer and compute that add up, times the transfer for real, records resources."""
import math
import statistics

import psutil
import pytest
import torch

from infracourse import bench
from infracourse.guard import LabCheckFailed
from infracourse.kit.data import ImageSet, to_device

REQUIRED = ["read", "batch_size", "workers", "warmup", "steps", "samples_per_s", "step_ms", "data_ms",
            "transfer_ms", "compute_ms", "cpu_percent", "rss_mb", "disk_read_mb", "gpu_util"]
NUMERIC = REQUIRED[1:-2]  # disk and gpu columns may be empty where the machine cannot tell


def _key(row):
    return row["read"], int(float(row["batch_size"])), int(float(row["workers"]))


def _rows_by_config(sweep):
    """{(read, batch, workers): row}, once the columns are known to be there and numeric."""
    if not sweep.rows:
        raise LabCheckFailed("the CSV written by sweep() has no rows")
    missing = [c for c in REQUIRED if c not in sweep.rows[0]]
    if missing:
        raise LabCheckFailed(f"the CSV lacks the columns {missing}; write a header with all of {REQUIRED}")
    for row in sweep.rows:
        for column in NUMERIC:
            try:
                value = float(row[column])
            except (TypeError, ValueError):
                value = math.nan
            if not math.isfinite(value):
                raise LabCheckFailed(f"row {_label(row)}: {column} is {row[column]!r}, not a number")
    return {_key(row): row for row in sweep.rows}


def _label(row):
    return f"read={row.get('read')} batch_size={row.get('batch_size')} workers={row.get('workers')}"


@pytest.mark.check("csv-complete")
def test_csv_complete(sweep, record):
    rows = _rows_by_config(sweep)
    wanted = [(c["read"], c["batch_size"], c["workers"]) for c in sweep.configs]
    missing = [w for w in wanted if w not in rows]
    record("configurations written", len(rows), target=len(wanted))
    if missing:
        raise LabCheckFailed(f"sweep() was given {len(wanted)} configurations but the CSV has no row for "
                             f"{missing} (read, batch_size, workers). Write one row for every configuration.")
    if len(sweep.rows) != len(wanted):
        raise LabCheckFailed(f"the CSV has {len(sweep.rows)} rows for {len(wanted)} configurations: one row each")
    for row in sweep.rows:
        if int(float(row["warmup"])) != sweep.warmup or int(float(row["steps"])) != sweep.steps:
            raise LabCheckFailed(f"row {_label(row)} says warmup={row['warmup']} steps={row['steps']}, but sweep() "
                                 f"was called with warmup={sweep.warmup}, steps={sweep.steps}: record what was run")


@pytest.mark.check("step-breakdown")
def test_step_breakdown(sweep, steady_step, record):
    rows = _rows_by_config(sweep)
    for row in rows.values():
        step = float(row["step_ms"])
        parts = float(row["data_ms"]) + float(row["transfer_ms"]) + float(row["compute_ms"])
        if min(float(row[c]) for c in ("data_ms", "transfer_ms", "compute_ms")) < 0 or step <= 0:
            raise LabCheckFailed(f"row {_label(row)}: negative or zero times")
        if abs(parts - step) > 0.10 * step:
            raise LabCheckFailed(
                f"row {_label(row)}: data wait + transfer + compute = {parts:.3f} ms but the step is {step:.3f} ms "
                f"({abs(parts - step) / step:.0%} apart, 10 % allowed). Time the step on its own clock and every part "
                "of it: waiting for the batch, copying it to the device, and the training step.")
        expected = int(float(row["batch_size"])) / (step / 1e3)
        if abs(float(row["samples_per_s"]) - expected) > 0.10 * expected:
            raise LabCheckFailed(f"row {_label(row)}: samples_per_s is {float(row['samples_per_s']):.0f} but "
                                 f"batch_size / step gives {expected:.0f}")
    # The learner's step time must agree with the grader's own measurement of the same configuration.
    reference = steady_step("file", 32, 0) * 1e3
    theirs = float(rows[("file", 32, 0)]["step_ms"]) if ("file", 32, 0) in rows else None
    record("baseline step (grader)", reference, unit="ms")
    if theirs is not None and not reference / 3 <= theirs <= reference * 3:  # wide: a shared machine's load varies
        raise LabCheckFailed(f"read=file batch_size=32 workers=0: your step time is {theirs:.2f} ms, the grader "
                             f"measures {reference:.2f} ms for the same configuration. Time whole steps on the "
                             "host clock, waiting for the device before reading it.")


@pytest.mark.check("transfer-timed")
def test_transfer_timed(sweep, device, record):
    rows = _rows_by_config(sweep)
    spec = ImageSet()
    for batch_size in sorted({key[1] for key in rows}):
        def make_args():
            images = torch.randint(0, 256, (batch_size, *spec.shape), dtype=torch.uint8)
            labels = torch.randint(0, spec.classes, (batch_size,))
            batch = (images.pin_memory(), labels.pin_memory()) if device == "cuda" else (images, labels)
            return (batch,)

        def copy(batch):
            out = to_device(batch, device)
            if device == "cuda":
                torch.cuda.synchronize()
            return out

        reference = bench.measure(copy, make_args=make_args, warmup=3, reps=30, flush_l2=False,
                                  device="cpu").median_s * 1e3
        record(f"copy of a {batch_size}-sample batch", reference, unit="ms")
        for key, row in rows.items():
            if key[1] == batch_size and float(row["transfer_ms"]) < 0.25 * reference:
                raise LabCheckFailed(
                    f"row {_label(row)}: transfer_ms is {float(row['transfer_ms']) * 1e3:.1f} us, but copying a batch "
                    f"of {batch_size} samples to the device takes {reference * 1e3:.1f} us here. The copy was counted "
                    "elsewhere (in compute): stop the transfer clock after to_device and after waiting for the "
                    "device, since a copy from pinned memory returns before it is done.")


@pytest.mark.check("resources")
def test_resources(sweep, record):
    rows = _rows_by_config(sweep)
    cores = psutil.cpu_count() or 1
    own_mb = psutil.Process().memory_info().rss / 2**20
    total_mb = psutil.virtual_memory().total / 2**20
    for row in rows.values():
        cpu, rss = float(row["cpu_percent"]), float(row["rss_mb"])
        if not 0 <= cpu <= 100 * cores:
            raise LabCheckFailed(f"row {_label(row)}: cpu_percent {cpu} is outside 0..{100 * cores}")
        if not own_mb / 4 <= rss <= total_mb:
            raise LabCheckFailed(f"row {_label(row)}: rss_mb {rss:.1f} is not this machine's resident memory of "
                                 f"the training process (this process alone holds {own_mb:.0f} MiB): use psutil's "
                                 "memory_info().rss, in MiB")
        if row["disk_read_mb"] not in ("", None) and float(row["disk_read_mb"]) < 0:
            raise LabCheckFailed(f"row {_label(row)}: negative disk reads")
    if all(float(row["cpu_percent"]) == 0 for row in rows.values()):
        raise LabCheckFailed("cpu_percent is 0 in every row: measure CPU use over the timed steps "
                             "(psutil.cpu_percent(None) before and after them)")
    record("busiest cpu_percent", max(float(row["cpu_percent"]) for row in rows.values()), unit="%")


@pytest.mark.check("gpu-util")
def test_gpu_utilisation(sweep, record):
    rows = _rows_by_config(sweep)
    values = []
    for row in rows.values():
        try:
            value = float(row["gpu_util"])
        except (TypeError, ValueError):
            raise LabCheckFailed(f"row {_label(row)}: gpu_util is {row['gpu_util']!r}; on a GPU record the device's "
                                 "utilisation counter (infracourse.kit.data.device_utilisation(); install "
                                 "nvidia-ml-py if it returns None)") from None
        if not 0 <= value <= 100:
            raise LabCheckFailed(f"row {_label(row)}: gpu_util {value} is not a percentage")
        values.append(value)
    record("median gpu_util", statistics.median(values), unit="%")
