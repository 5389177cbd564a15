"""Week 2 raw data: the learner's sweep, re-run on a reduced grid drawn from the run's seed, covers every
configuration, describes runs the grader observed (the stamped course model handed in as `trainer`), splits
each step into data wait, transfer and compute that add up, agrees with the grader's own unobserved
measurement, times the transfer for real, records resources."""
import math
import statistics

import psutil
import pytest
import torch

from infracourse import bench
from infracourse.grader import LabCheckFailed, cpu_contention
from infracourse.kit.data import ImageSet, dataset_batches, to_device

from week02_judging import BASELINE

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
    # The learner's step time (an observed run, the learner's loader) must agree with the grader's own
    # unobserved measurement of the same configuration with the course's per-file loader.
    reference = steady_step(*BASELINE, course=True)[0] * 1e3
    theirs = float(rows[BASELINE]["step_ms"]) if BASELINE in rows else None
    record("baseline step (grader)", reference, unit="ms")
    if theirs is not None:
        record("baseline step (yours over the grader's)", theirs / reference, unit="x")
    if theirs is not None and not reference / 4 <= theirs <= reference * 4:  # wide: a shared machine's load varies (0.52 seen at load 6)
        raise LabCheckFailed(f"read=file batch_size=32 workers=0: your step time is {theirs:.2f} ms, the grader "
                             f"measures {reference:.2f} ms for the same configuration with the course's per-file "
                             "loader. Time whole steps on the host clock, waiting for the device before reading "
                             "it, and leave FileDataset as the naive baseline it is.")


@pytest.mark.check("runs-observed")
def test_runs_observed(sweep, record):
    """Each row describes the run the stamped trainer saw: one trainer per configuration, in the order given,
    warmup + steps steps at the row's batch size on the dataset's batches; the row's step and compute times
    hold the stamped times of its timed steps (same run, same clock: tight bounds that load does not move)."""
    rows = _rows_by_config(sweep)
    if len(sweep.runs) != len(sweep.configs):
        raise LabCheckFailed(
            f"sweep() was given {len(sweep.configs)} configurations and made {len(sweep.runs)} trainers with the "
            "`trainer` it was given: call trainer(device) once per configuration, before its warm-up, and train "
            "every step with that model and optimiser (train_step). A row is graded against the run it describes.")
    worst = high_use = compute_low = compute_use = most_waited = 0.0
    compute_low = math.inf
    # The learner stops its clock after the last stamped step; on a loaded machine the scheduler may run another
    # task in between (a step of 8 x 1.1 ms was once reported 2 ms long that way, at three grades at once on 2
    # cores): one slice more per 1 of load over a core, at most 4 ms, which the learner's own load cannot raise
    # further
    contention = cpu_contention()
    slack_s = 1e-3 + min(4e-3, 2e-3 * (contention - 1.0))
    for config, run in zip(sweep.configs, sweep.runs):
        key = (config["read"], config["batch_size"], config["workers"])
        what = f"read={key[0]} batch_size={key[1]} workers={key[2]}"
        row = rows.get(key)
        if row is None:
            continue  # csv-complete says which rows are missing
        total = sweep.warmup + sweep.steps
        if len(run) != total:
            raise LabCheckFailed(f"{what}: the trainer made for this configuration trained {len(run)} steps; "
                                 f"warmup={sweep.warmup} + steps={sweep.steps} = {total} were asked for")
        if any(step[3] != key[1] for step in run):
            raise LabCheckFailed(f"{what}: the trainer saw batches of {sorted({step[3] for step in run})} samples, "
                                 f"not {key[1]}")
        if any(not math.isfinite(end) for _, end, *_ in run):
            raise LabCheckFailed(f"{what}: a step ran the model but not the optimiser step: use train_step")
        known = dataset_batches(ImageSet(), key[1])
        batches = [known.get(step[2]) for step in run]
        if None in batches:
            i = batches.index(None)
            raise LabCheckFailed(f"{what}: step {i} trained on images that are not one of the dataset's batches of "
                                 f"{key[1]} (samples k*{key[1]}..): feed train_step the loader's batches")
        if len(known) > 1 and any(a == b for a, b in zip(batches, batches[1:])):
            raise LabCheckFailed(f"{what}: two consecutive steps trained on the same batch ({batches}): every step "
                                 "takes the loader's next batch")
        timed = run[sweep.warmup:]
        after_warmup = run[sweep.warmup - 1][1]  # the warm-up's last optimiser step ended here
        first_start, last_end = timed[0][0], timed[-1][1]
        step_total = float(row["step_ms"]) * sweep.steps / 1e3
        compute_total = float(row["compute_ms"]) * sweep.steps / 1e3
        stamped_compute = sum(end - start for start, end, *_ in timed)
        # An honest compute clock also spans a sliver of each gap between stamped steps, and on a loaded machine
        # the scheduler may run another task right there (a burst of four regrades on 2 cores once made a 1.08 ms
        # step read 2.44 ms): the training thread's run-queue wait in the gaps, measured by the kernel at the
        # stamps (the load average lags such a burst by a minute), is allowed on top.
        waited = run[-1][5] - run[sweep.warmup - 1][5] - sum(step[5] - step[4] for step in timed)
        gap_wait = waited if math.isfinite(waited) and waited > 0 else 0.0
        compute_high = stamped_compute * 1.25 + 0.25 * (last_end - after_warmup) + gap_wait
        most_waited = max(most_waited, gap_wait / sweep.steps)
        # The timed loop contains every timed step's model call and optimiser step, and lies after the
        # warm-up's last step: a step time outside these bounds is not this run's.
        low, high = (last_end - first_start) * 0.97 - 1e-4, (last_end - after_warmup) * 1.10 + slack_s
        worst = max(worst, step_total / max(last_end - first_start, 1e-9))
        high_use = max(high_use, step_total / high)
        compute_low = min(compute_low, compute_total / max(stamped_compute, 1e-9))
        compute_use = max(compute_use, compute_total / compute_high)
        if not low <= step_total <= high:
            raise LabCheckFailed(
                f"{what}: step_ms {float(row['step_ms']):.3f} ms, but the stamped model trained these "
                f"{sweep.steps} timed steps in {(last_end - first_start) / sweep.steps * 1e3:.3f} ms each "
                f"(at most {(last_end - after_warmup) / sweep.steps * 1e3:.3f} ms with the data waits, plus "
                f"{slack_s * 1e3:.0f} ms in all for the machine's load, {contention:.1f} per core): time the "
                "steps you report, on the host clock, from before the first timed batch is fetched to after "
                "the last step, and divide by the steps.")
        if compute_total < stamped_compute * 0.97 - 1e-4 or compute_total > compute_high:
            raise LabCheckFailed(
                f"{what}: compute_ms {float(row['compute_ms']):.3f} ms, but train_step ran "
                f"{stamped_compute / sweep.steps * 1e3:.3f} ms a step (from its forward to the end of its "
                f"optimiser step, stamped by the model; at most {compute_high / sweep.steps * 1e3:.3f} ms allowed, "
                f"{gap_wait / sweep.steps * 1e3:.3f} ms of it the measured wait for a CPU between steps): the "
                "compute clock starts just before train_step and "
                "stops after it (and the device) finished, and holds nothing else.")
    record("reported step over stamped span (worst)", worst, unit="x")
    record("reported step over its upper bound (worst)", high_use, unit="x")
    record("cpu contention", contention, unit="x")
    if math.isfinite(compute_low):
        record("reported compute over stamped (lowest)", compute_low, unit="x")
    record("reported compute over its upper bound (worst)", compute_use, unit="x")
    record("run-queue wait between stamped steps (most, per step)", most_waited * 1e3, unit="ms")


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
        record(f"lowest transfer_ms over the copy, batch {batch_size}",
               min(float(row["transfer_ms"]) for key, row in rows.items() if key[1] == batch_size) / reference,
               unit="x")
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
        # 0.01 % either side: a difference of two float CPU-time sums rounds past 0 (an honest style's idle row
        # came -2.9e-07, once in a full suite)
        if not -0.01 <= cpu <= 100 * cores + 0.01:
            raise LabCheckFailed(f"row {_label(row)}: cpu_percent {cpu} is outside 0..{100 * cores}")
        # The grader reads the training process's resident memory itself (after the sweep): the row's figure,
        # that process plus its loader workers, holds at least half of it and at most a few copies per process.
        floor = sweep.worker_rss_mb / 2 if sweep.worker_rss_mb else own_mb / 4
        ceiling = min(total_mb, (int(float(row["workers"])) + 1) * 3 * max(sweep.worker_rss_mb, own_mb) + 256)
        if not floor <= rss <= ceiling:
            raise LabCheckFailed(f"row {_label(row)}: rss_mb {rss:.1f}, but the grader reads "
                                 f"{sweep.worker_rss_mb:.0f} MiB resident in the training process after the sweep "
                                 f"(expected {floor:.0f}..{ceiling:.0f} MiB for it and its workers): use psutil's "
                                 "memory_info().rss of the process and its children, in MiB")
        if row["disk_read_mb"] not in ("", None) and float(row["disk_read_mb"]) < 0:
            raise LabCheckFailed(f"row {_label(row)}: negative disk reads")
    if all(float(row["cpu_percent"]) == 0 for row in rows.values()):
        raise LabCheckFailed("cpu_percent is 0 in every row: measure CPU use over the timed steps "
                             "(psutil.cpu_percent(None) before and after them)")
    record("busiest cpu_percent", max(float(row["cpu_percent"]) for row in rows.values()), unit="%")
    record("training process resident memory (grader)", sweep.worker_rss_mb, unit="MiB")


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
