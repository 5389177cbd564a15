"""The load matrix of weeks 15-18: input length x output length x load, each cell a benchmark run with the
course's load generator (kit/loadgen.py), its raw per-request records on disk and its metrics beside them.

Two kinds of load, as a serving engineer sweeps them:
  closed loop   `concurrency` users, each sending its next request as soon as its last one ends (all requests
                arrive at once, a semaphore of `concurrency` slots): the load the server sees is fixed, the rate
                follows from the latency.
  open loop     requests arrive at `rate` per second whatever the server does: gaps Gamma(burstiness,
                1 / (rate * burstiness)), burstiness 1 a Poisson process, < 1 burstier (same mean rate, bigger
                clumps): a server slower than the rate builds a queue, which TTFT shows.

    cells = load_matrix(input_lens=[32, 256], output_lens=[16, 64], concurrencies=[1, 4, 16],
                        rates=[2.0, 8.0], burstiness=[1.0, 0.5], requests=32)
    rows = run_matrix(cells, "results/", uds="/tmp/x/server.sock", goodput_slo_ms={"ttft": 500, "tpot": 50})
    problems = check_matrix("results/", cells)      # [] when every cell is there and its figures recompute

On disk (`results/`): one `<cell name>.json` per cell as loadgen.write_records writes it (the cell's conditions
in "conditions") and `matrix.json` = {"percentiles", "goodput_slo_ms", "conditions" (what holds for every cell:
device, server limits, cache), "cells": [{"cell", "file", "seed", "vocab_size", "metrics"}]}: a cell's seed and
vocabulary give back its prompts and its arrival times (run_cell), so a judge can re-run it request for request.
`load_problems(records, cell, seed=)` tells whether a cell's records show its load (users in flight, arrival times).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from infracourse.kit.loadgen import (RequestRecord, arrival_offsets, compute_metrics, read_records, request_matrix,
                                     run_load, write_records)

PERCENTILES = (50, 95, 99)
SUMMARY = "matrix.json"


@dataclass(frozen=True)
class LoadCell:
    input_len: int
    output_len: int
    requests: int
    concurrency: int | None = None  # closed loop: users in flight
    rate: float = math.inf          # open loop: requests per second
    burstiness: float = 1.0         # open loop: 1 Poisson, < 1 bursty

    def __post_init__(self):
        if min(self.input_len, self.output_len, self.requests) < 1:
            raise ValueError(f"a load cell needs input_len, output_len and requests >= 1: {self}")
        closed, opened = self.concurrency is not None, not math.isinf(self.rate)
        if closed == opened:
            raise ValueError(f"a load cell is closed loop (concurrency) or open loop (a finite rate), one of the "
                             f"two: {self}")
        if closed and not 1 <= self.concurrency <= self.requests:
            raise ValueError(f"concurrency {self.concurrency} needs 1 .. requests ({self.requests}) requests: with "
                             "fewer the server never sees that many users")
        if opened and not (self.rate > 0 and self.burstiness > 0):
            raise ValueError(f"rate and burstiness must be > 0: {self}")

    @property
    def loop(self) -> str:
        return "closed" if self.concurrency is not None else "open"

    @property
    def name(self) -> str:
        load = f"c{self.concurrency}" if self.loop == "closed" else f"r{self.rate:g}-b{self.burstiness:g}"
        return f"in{self.input_len}-out{self.output_len}-{load}"

    def conditions(self) -> dict:
        """What the run was, stored beside its records."""
        arrivals = ("all at once, concurrency-capped" if self.loop == "closed" else
                    "Poisson" if self.burstiness == 1 else f"gamma gaps, burstiness {self.burstiness:g}")
        return {**asdict(self), "rate": None if math.isinf(self.rate) else self.rate, "loop": self.loop,
                "arrivals": arrivals}


def load_matrix(input_lens: Sequence[int], output_lens: Sequence[int], *, requests: int,
                concurrencies: Sequence[int] = (), rates: Sequence[float] = (),
                burstiness: Sequence[float] = (1.0,)) -> list[LoadCell]:
    """Every (input, output) pair under every closed-loop concurrency and every open-loop (rate, burstiness)."""
    loads = [{"concurrency": c} for c in concurrencies] + [{"rate": r, "burstiness": b} for r in rates
                                                           for b in burstiness]
    if not loads:
        raise ValueError("a load matrix needs at least one concurrency or one rate")
    return [LoadCell(i, o, requests, **load) for i in input_lens for o in output_lens for load in loads]


def run_cell(cell: LoadCell, *, seed: int = 0, vocab_size: int = 256, **transport):
    """(records, duration_s) of one cell: `requests` random prompts of input_len ids, each asking output_len
    tokens, sent under the cell's load. `transport`: run_load's base_url / uds / send / timeout_s ..."""
    specs = request_matrix([cell.input_len], [cell.output_len], cell.requests, vocab_size=vocab_size, seed=seed)
    return run_load(specs, rate=cell.rate, burstiness=cell.burstiness, concurrency=cell.concurrency, seed=seed,
                    **transport)


def run_matrix(cells: Sequence[LoadCell], out_dir, *, seed: int = 0, vocab_size: int = 256, percentiles=PERCENTILES,
               goodput_slo_ms: dict | None = None, conditions: dict | None = None, **transport) -> list[dict]:
    """Run every cell in order (cell k with seed + k), write its records and matrix.json; returns the rows.
    `conditions`: what holds for every cell (the device, the server's limits, the cache), kept in matrix.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, cell in enumerate(cells):
        records, duration = run_cell(cell, seed=seed + k, vocab_size=vocab_size, **transport)
        write_records(out / f"{cell.name}.json", records, duration, **cell.conditions())
        rows.append({"cell": cell.conditions(), "file": f"{cell.name}.json", "seed": seed + k,
                     "vocab_size": vocab_size,
                     "metrics": compute_metrics(records, duration, percentiles=percentiles,
                                                goodput_slo_ms=goodput_slo_ms)})
    summary = {"percentiles": list(percentiles), "goodput_slo_ms": goodput_slo_ms, "conditions": conditions or {},
               "cells": rows}
    (out / SUMMARY).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return rows


def _differences(reported, recomputed, where: str, rel: float) -> list[str]:
    """Every leaf of `recomputed` that `reported` lacks or gets wrong beyond rel, named by its path."""
    if isinstance(recomputed, dict):
        if not isinstance(reported, dict):
            return [f"{where}: expected a table of figures, got {reported!r:.80}"]
        return [p for k, v in recomputed.items() for p in _differences(reported.get(k), v, f"{where}.{k}", rel)]
    if recomputed is None or isinstance(recomputed, str):
        return [] if reported == recomputed else [f"{where}: {reported!r} reported, {recomputed!r} recomputed"]
    if isinstance(reported, bool) or not isinstance(reported, (int, float)) or not math.isclose(
            reported, recomputed, rel_tol=rel, abs_tol=1e-9):
        return [f"{where}: {reported!r} reported, {recomputed:.6g} recomputed from the raw records"]
    return []


def check_matrix(out_dir, expected: Sequence[LoadCell], *, rel: float = 1e-6) -> list[str]:
    """What is wrong with a matrix on disk, one line each ([] when nothing): a cell of `expected` missing, run
    with other conditions or another number of requests, or a figure of matrix.json that its raw records do
    not give (recomputed with matrix.json's own percentiles and SLO)."""
    out = Path(out_dir)
    try:
        summary = json.loads((out / SUMMARY).read_text(encoding="utf-8"))
        rows = {row["file"]: row for row in summary["cells"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{out / SUMMARY}: unreadable ({type(exc).__name__}: {exc}); run_matrix writes it"]
    problems = []
    for cell in expected:
        file = f"{cell.name}.json"
        if file not in rows or not (out / file).exists():
            problems.append(f"cell {cell.name}: missing (no {file} in {SUMMARY} or on disk): every cell must be run")
            continue
        try:
            records, duration, conditions = read_records(out / file)
        except (OSError, ValueError) as exc:
            problems.append(f"cell {cell.name}: {file}: {exc}")
            continue
        if conditions != cell.conditions() or rows[file].get("cell") != cell.conditions():
            problems.append(f"cell {cell.name}: run under {conditions}, not the cell's {cell.conditions()}")
        if len(records) != cell.requests:
            problems.append(f"cell {cell.name}: {len(records)} records for {cell.requests} requests")
        again = compute_metrics(records, duration, percentiles=summary.get("percentiles") or PERCENTILES,
                                goodput_slo_ms=summary.get("goodput_slo_ms"))
        problems += [f"cell {cell.name}: {p}" for p in _differences(rows[file].get("metrics"), again, "metrics", rel)]
    return problems


def in_flight_peak(records: Sequence[RequestRecord]) -> int:
    """The most requests in flight at once on the client's clock: each from its send to its last chunk (a
    request without a chunk only at its send)."""
    events = sorted([(r.send_time, 1) for r in records] +
                    [(r.chunk_times[-1] if r.chunk_times else r.send_time, -1) for r in records])
    peak = now = 0
    for _, step in events:  # an end before a send at the same instant: the slot was given back first
        now += step
        peak = max(peak, now)
    return peak


def load_problems(records: Sequence[RequestRecord], cell: LoadCell, *, seed: int, spread_s: float = 0.1) -> list[str]:
    """What in a cell's records (in send order, run with `seed`) contradicts the cell's load, one line each ([]
    when nothing). Closed loop: never more than `concurrency` requests in flight, and exactly that many when
    every request succeeded (the first `concurrency` are sent at once). Open loop: each request sent on the
    arrival clock of arrival_offsets(seed): its send time less its planned arrival is the same for every request
    within spread_s, but for one in ten sent late by up to 3 x spread_s: a busy machine sends a request late now
    and then (122 ms once, at load 11 on 2 cores), never early; a closed loop sends early where slots free sooner
    than arrivals come, all at once sends them early, and another seed's arrivals are off both ways."""
    if not records:
        return [f"no records: a cell of {cell.requests} requests"]
    if cell.loop == "closed":
        peak = in_flight_peak(records)
        if peak > cell.concurrency or (peak < cell.concurrency and all(r.success for r in records)):
            return [f"at most {peak} request(s) in flight at once (send to last chunk), a closed loop of "
                    f"{cell.concurrency} users keeps {cell.concurrency}: these records are another load's"]
        return []
    planned = arrival_offsets(len(records), cell.rate, cell.burstiness, seed=seed)
    offset = [r.send_time - at for r, at in zip(records, planned)]
    typical = float(np.median(offset))
    off = [o - typical for o in offset]
    worst = max(range(len(records)), key=lambda i: abs(off[i]))
    late = sum(o > spread_s for o in off)
    allowed = max(1, len(records) // 10)
    if min(off) < -spread_s or late > allowed or max(off) > 3 * spread_s:
        return [f"request {worst} was sent {off[worst] * 1000:+.0f} ms off its arrival time "
                f"({planned[worst] * 1000:.0f} ms after the first, arrival_offsets with seed {seed}); an open loop "
                f"sends every request within {spread_s * 1000:.0f} ms of its arrival time (a busy machine may send "
                f"{allowed} of {len(records)} late, by at most {3 * spread_s * 1000:.0f} ms, never early) whatever "
                "the server does"]
    return []


def plot_latency_throughput(rows: Sequence[dict], path, *, latency: str = "e2el_ms", stat: str = "p99",
                            title: str | None = None) -> None:
    """One curve per (input, output) pair and loop: output tokens/s (x) against a latency statistic (y), a point
    per load, labelled with its concurrency or rate: where more load stops buying throughput and buys latency.
    `title` states what the figures are of (a device, or the course's CPU stand-in)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[tuple, list] = {}
    for row in rows:
        c = row["cell"]
        load = c["concurrency"] if c["loop"] == "closed" else c["rate"]
        curves.setdefault((c["input_len"], c["output_len"], c["loop"], c["burstiness"]), []).append(
            (load, row["metrics"]["output_throughput"], row["metrics"][latency][stat]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (i, o, loop, b), points in sorted(curves.items()):
        points.sort()
        label = f"in {i}, out {o}, " + ("closed loop" if loop == "closed" else f"open loop, burstiness {b:g}")
        ax.plot([p[1] for p in points], [p[2] for p in points], marker="o", label=label)
        for load, x, y in points:
            ax.annotate(f"{'c' if loop == 'closed' else 'r'}={load:g}", (x, y), fontsize=7)
    ax.set_xlabel("output tokens / s")
    ax.set_ylabel(f"{latency.removesuffix('_ms').upper()} {stat} (ms)")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
