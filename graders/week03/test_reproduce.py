"""Week 3 delivers a benchmark script and its raw data, reproducible from a clean checkout: the grader runs
`python experiment.py --raw raw.json` itself, from the submitted files alone in an empty folder, and every summary
in what it wrote must recompute from the raw data beside it."""
import json
import math

import numpy as np
import pytest

from infracourse.grader import LabCheckFailed, run_script
from infracourse.kit.sequences import random_batches

LIMIT_S = 120
BATCHES = dict(batches=8, batch_size=16, vocab=256, seed=0)  # experiment.py's workload, as the handout fixes it


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _close(a, b, rel=0.01) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def _check_measure(name: str, result, positions: int, useful: int) -> None:
    keys = ("utilisation", "tokens_per_s", "useful_tokens_per_s", "wall_s")
    if not isinstance(result, dict) or not all(_number(result.get(k)) for k in keys) \
            or not isinstance(result.get("samples_s"), list) or not all(map(_number, result["samples_s"])):
        raise LabCheckFailed(f"raw.json: measure.{name} must be measure()'s dict with numbers for {list(keys)} and "
                             "the list samples_s")
    samples, wall = result["samples_s"], result["wall_s"]
    if len(samples) != BATCHES["batches"] or wall <= 0:
        raise LabCheckFailed(f"raw.json: measure.{name} holds {len(samples)} samples and wall_s {wall}; the "
                             f"{BATCHES['batches']} timed batches give {BATCHES['batches']} samples and a positive wall")
    for key, value in (("utilisation", sum(samples) / wall), ("tokens_per_s", positions / wall),
                       ("useful_tokens_per_s", useful / wall)):
        if not _close(result[key], value):
            raise LabCheckFailed(f"raw.json: measure.{name}.{key} is {result[key]:.4g}, but its raw data gives "
                                 f"{value:.4g} (samples_s, wall_s and the batches' {positions} positions, {useful} "
                                 "real tokens): the summary must be computed from what was measured")


def _check_row(name: str, row) -> None:
    keys = ("concurrency", "throughput_rps", "mean_latency_s", "p99_latency_s")
    if not isinstance(row, dict) or not all(_number(row.get(k)) for k in keys) \
            or not isinstance(row.get("latencies_s"), list) or not row["latencies_s"] \
            or not all(_number(x) and x >= 0 for x in row["latencies_s"]):
        raise LabCheckFailed(f"raw.json: every row of table.{name} needs numbers for {list(keys)} and latencies_s, "
                             "the latency of every request it served (the raw data its mean and p99 come from)")
    latencies = np.asarray(row["latencies_s"], dtype=float)
    where = f"table.{name}, concurrency {row['concurrency']}"
    if not _close(row["mean_latency_s"], float(latencies.mean())):
        raise LabCheckFailed(f"raw.json: {where}: mean_latency_s {row['mean_latency_s']:.4g} is not the mean of its "
                             f"latencies_s ({latencies.mean():.4g})")
    # any usual percentile definition lies between these two: interpolated, nearest rank, or the order statistic
    low, high = np.percentile(latencies, 98), latencies.max()
    if not low * 0.999 <= row["p99_latency_s"] <= high * 1.001:
        raise LabCheckFailed(f"raw.json: {where}: p99_latency_s {row['p99_latency_s']:.4g} is not the 99th "
                             f"percentile of its {latencies.size} latencies_s (between {low:.4g} and {high:.4g})")


@pytest.mark.check("reproduces")
def test_experiment_reproduces_from_a_clean_checkout(learner, tmp_path):
    run = run_script(learner.root, "experiment.py", ["--raw", "raw.json"], scratch=tmp_path, timeout_s=LIMIT_S)
    if (failure := run.failure(LIMIT_S)) is not None:
        raise LabCheckFailed(f"{failure}\nThe grader runs your script as a reader of your report would, from the "
                             "submitted files alone in an empty folder: it must run to the end from there")
    out = tmp_path / "raw.json"
    try:
        raw = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        raise LabCheckFailed(f"`{run.command}` exited cleanly but raw.json could not be read ({exc}): with --raw "
                             "FILE it must write the raw data as JSON (the starter's main does)") from None
    if not isinstance(raw, dict):
        raise LabCheckFailed("raw.json must hold one JSON object: padding_factor, measure, table")
    batches = random_batches(BATCHES["batches"], BATCHES["batch_size"], vocab=BATCHES["vocab"], seed=BATCHES["seed"])
    useful = sum(len(s) for b in batches for s in b)
    padded = sum(len(b) * max(len(s) for s in b) for b in batches)
    if not _number(raw.get("padding_factor")) or not _close(raw["padding_factor"], padded / useful, 1e-6):
        raise LabCheckFailed(f"raw.json: padding_factor {raw.get('padding_factor')} is not the factor of "
                             f"experiment.py's batches ({padded / useful:.4f}): padded positions over real tokens")
    measure, table = raw.get("measure"), raw.get("table")
    for name, positions in (("pad", padded), ("pack", useful)):
        _check_measure(name, (measure or {}).get(name) if isinstance(measure, dict) else None, positions, useful)
        rows = table.get(name) if isinstance(table, dict) else None
        if not isinstance(rows, list) or not rows:
            raise LabCheckFailed(f"raw.json: table.{name} must be the list of latency_table rows")
        for row in rows:
            _check_row(name, row)
