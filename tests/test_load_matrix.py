"""The serving metrics recomputed from raw records by an independent computation (docs/serving-metrics.md), and
the load matrix (kit.load_matrix): closed- and open-loop cells, raw records per cell, and the check that finds a
skipped cell or a figure its records do not give."""
import asyncio
import dataclasses
import json
import math
import random
import statistics

import pytest

from infracourse.kit.load_matrix import (LoadCell, check_matrix, in_flight_peak, load_matrix, load_problems,
                                        plot_latency_throughput, run_matrix)
from infracourse.kit.loadgen import (RequestRecord, RequestSpec, arrival_offsets, compute_metrics, read_records,
                                     record_stream)


def percentile(values, p):
    """Linear interpolation between closest ranks, written out: rank p/100 * (n - 1) of the sorted values."""
    v = sorted(values)
    rank = p / 100 * (len(v) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def stats_ms(seconds, ps):
    v = [x * 1000 for x in seconds] or [0.0]
    return {"mean": statistics.fmean(v), "median": statistics.median(v), "std": statistics.pstdev(v),
            **{f"p{p}": percentile(v, p) for p in ps}}


def random_records(n, seed):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        send = r.uniform(0, 5)
        if r.random() < 0.15:
            out.append(RequestRecord(r.randint(1, 99), send, [], 0, False, "HTTP 503"))
            continue
        chunks = r.randint(1, 12)
        times = [send + r.uniform(0.01, 0.5)]
        for _ in range(chunks - 1):
            times.append(times[-1] + r.expovariate(50))
        tokens = chunks + r.choice([0, 0, 3])  # a server may put several tokens in one chunk (usage counts them)
        out.append(RequestRecord(r.randint(1, 99), send, times, tokens, True))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_metric_recomputed_from_raw_records(seed):
    records = random_records(60, seed)
    ok = [r for r in records if r.success]
    ps = (50, 95, 99)
    slo = {"ttft": 300.0, "tpot": 25.0, "e2el": 600.0}
    duration = max(r.chunk_times[-1] for r in ok) - min(r.send_time for r in records)
    ttft = [r.chunk_times[0] - r.send_time for r in ok]
    e2el = [r.chunk_times[-1] - r.send_time for r in ok]
    # TPOT: decode time after the first token over the tokens after the first; one-token requests have none
    tpot = [(e - t) / (r.output_tokens - 1) for r, t, e in zip(ok, ttft, e2el) if r.output_tokens > 1]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    good = sum(t <= 0.3 and e <= 0.6 and (r.output_tokens <= 1 or (e - t) / (r.output_tokens - 1) <= 0.025)
               for r, t, e in zip(ok, ttft, e2el))
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    want = {"completed": len(ok), "failed": len(records) - len(ok), "failure_rate": 1 - len(ok) / len(records),
            "total_input": in_tokens, "total_output": out_tokens, "duration_s": duration,
            "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
            "total_token_throughput": (in_tokens + out_tokens) / duration, "request_goodput": good / duration,
            "ttft_ms": stats_ms(ttft, ps), "tpot_ms": stats_ms(tpot, ps), "itl_ms": stats_ms(itl, ps),
            "e2el_ms": stats_ms(e2el, ps)}
    got = compute_metrics(records, duration, percentiles=ps, goodput_slo_ms=slo)
    assert set(got) == set(want)  # a metric added without an independent recomputation fails here
    assert 0 < want["failed"] and 0 < good < len(ok) and len(tpot) < len(ok)  # the trace exercises each rule
    for key, value in want.items():
        if isinstance(value, dict):
            assert set(got[key]) == set(value), key
            for stat, v in value.items():
                assert got[key][stat] == pytest.approx(v, rel=1e-9, abs=1e-9), f"{key}.{stat}"
        else:
            assert got[key] == pytest.approx(value, rel=1e-12), key


def test_the_matrix_crosses_lengths_with_closed_and_open_loads():
    cells = load_matrix([16, 64], [4, 8], concurrencies=[1, 4], rates=[5.0], burstiness=[1.0, 0.25], requests=8)
    assert len(cells) == 2 * 2 * (2 + 2) and len({c.name for c in cells}) == len(cells)
    assert {c.loop for c in cells} == {"closed", "open"}
    assert LoadCell(16, 4, 8, concurrency=4).name == "in16-out4-c4"
    assert LoadCell(16, 4, 8, rate=5.0, burstiness=0.25).name == "in16-out4-r5-b0.25"
    for bad, why in [({"concurrency": 4, "rate": 2.0}, "one of the two"), ({}, "one of the two"),
                     ({"concurrency": 9}, "never sees that many users"), ({"rate": 2.0, "burstiness": 0}, "> 0")]:
        with pytest.raises(ValueError, match=why):
            LoadCell(16, 4, 8, **bad)
    with pytest.raises(ValueError, match="at least one concurrency or one rate"):
        load_matrix([16], [4], requests=8)


class FakeEngine:
    """An in-process engine: 3 ms to the first token, 1 ms per further token; counts requests in flight."""

    def __init__(self):
        self.in_flight = self.most = 0
        self.started = []

    async def tokens(self, spec):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.started.append(asyncio.get_running_loop().time())
        try:
            await asyncio.sleep(0.003)
            for i in range(spec.max_tokens):
                if i:
                    await asyncio.sleep(0.001)
                yield "x"
        finally:
            self.in_flight -= 1

    def send(self, spec):
        return record_stream(spec, self.tokens(spec))


def test_closed_loop_holds_its_users_and_open_loop_keeps_its_arrivals(tmp_path):
    engine = FakeEngine()
    closed = [LoadCell(8, 5, 12, concurrency=3)]
    rows = run_matrix(closed, tmp_path / "c", send=engine.send)
    assert engine.most == 3  # never more, and reached: 12 requests through 3 slots
    assert rows[0]["metrics"]["completed"] == 12 and rows[0]["metrics"]["total_output"] == 60

    engine = FakeEngine()
    cell = LoadCell(8, 2, 6, rate=10.0, burstiness=0.5)
    run_matrix([cell], tmp_path / "o", seed=4, send=engine.send)
    records, _, conditions = read_records(tmp_path / "o" / f"{cell.name}.json")
    assert conditions["loop"] == "open" and conditions["arrivals"] == "gamma gaps, burstiness 0.5"
    sent = [r.send_time - records[0].send_time for r in records]
    planned = arrival_offsets(6, 10.0, 0.5, seed=4)  # run_matrix gives cell k the seed seed + k
    assert sent == pytest.approx(planned, abs=0.05)  # sent on the arrival clock, not when a slot frees


def test_check_matrix_finds_a_skipped_cell_a_short_cell_and_a_figure_the_records_do_not_give(tmp_path):
    cells = load_matrix([4], [3], concurrencies=[1, 2], rates=[50.0], requests=4)
    run_matrix(cells, tmp_path, send=FakeEngine().send, goodput_slo_ms={"ttft": 50})
    assert check_matrix(tmp_path, cells) == []

    summary = json.loads((tmp_path / "matrix.json").read_text())
    summary["cells"][1]["metrics"]["ttft_ms"]["p99"] /= 2
    (tmp_path / "matrix.json").write_text(json.dumps(summary))
    assert [p.split(":")[0] for p in check_matrix(tmp_path, cells)] == ["cell in4-out3-c2"]
    assert "metrics.ttft_ms.p99" in check_matrix(tmp_path, cells)[0]

    summary["cells"].pop(1)
    (tmp_path / "matrix.json").write_text(json.dumps(summary))
    assert check_matrix(tmp_path, cells) == [
        "cell in4-out3-c2: missing (no in4-out3-c2.json in matrix.json or on disk): every cell must be run"]

    data = json.loads((tmp_path / "in4-out3-r50-b1.json").read_text())
    data["records"].pop()
    (tmp_path / "in4-out3-r50-b1.json").write_text(json.dumps(data))
    assert any("3 records for 4 requests" in p for p in check_matrix(tmp_path, cells))


def test_record_stream_records_a_failure_and_the_plot_is_drawn(tmp_path):
    async def broken():
        yield "a"
        raise RuntimeError("engine fell over")

    rec = asyncio.run(record_stream(RequestSpec([1, 2], 3), broken()))
    assert not rec.success and rec.error == "RuntimeError: engine fell over" and rec.output_tokens == 0
    rows = run_matrix(load_matrix([4], [3], concurrencies=[1, 2], requests=2), tmp_path, send=FakeEngine().send)
    plot_latency_throughput(rows, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_matrix_json_keeps_each_cells_seed_and_the_runs_conditions(tmp_path):
    """A cell's seed and vocabulary give back its prompts and arrival times: a judge can re-run it request for
    request; the run-wide conditions (device, limits, cache) are kept beside the cells."""
    cells = load_matrix([4], [3], concurrencies=[2], rates=[40.0], requests=4)
    run_matrix(cells, tmp_path, seed=7, vocab_size=128, conditions={"device": "cpu"}, send=FakeEngine().send)
    summary = json.loads((tmp_path / "matrix.json").read_text())
    assert summary["conditions"] == {"device": "cpu"}
    assert [(row["seed"], row["vocab_size"]) for row in summary["cells"]] == [(7, 128), (8, 128)]
    assert check_matrix(tmp_path, cells) == []


def test_load_problems_tell_a_run_under_another_load(tmp_path):
    """Closed loop: the records of 1 user filed under 4 show 1 in flight; open loop: a run that sent when slots
    freed (or all at once) is off its arrival clock. The cell's own runs show nothing."""
    four, one = LoadCell(8, 40, 8, concurrency=4), LoadCell(8, 40, 8, concurrency=1)  # ~45 ms a request
    opened = LoadCell(8, 40, 8, rate=10.0, burstiness=0.25)
    run_matrix([four, one, opened], tmp_path, seed=3, send=FakeEngine().send)
    runs = {cell: read_records(tmp_path / f"{cell.name}.json")[0] for cell in (four, one, opened)}
    assert in_flight_peak(runs[four]) == 4 and in_flight_peak(runs[one]) == 1
    assert load_problems(runs[four], four, seed=3) == []
    assert load_problems(runs[one], one, seed=4) == []
    assert load_problems(runs[opened], opened, seed=5) == []
    assert "at most 1 request(s) in flight" in load_problems(runs[one], four, seed=3)[0]
    assert "a closed loop of 1 users keeps 1" in load_problems(runs[four], one, seed=4)[0]
    # the closed loop's records as the open cell's: sent when a slot freed, not on the arrival clock
    assert "off its arrival time" in load_problems(runs[one], opened, seed=5)[0]
    # the open cell's records with the wrong seed: other arrival times
    assert "off its arrival time" in load_problems(runs[opened], opened, seed=6)[0]
    # a busy machine's straggler: one request of the eight sent 120 ms late passes; sent early, or two late, do not
    def shifted(records, by: dict):
        return [dataclasses.replace(r, send_time=r.send_time + by.get(i, 0.0),
                                    chunk_times=[t + by.get(i, 0.0) for t in r.chunk_times])
                for i, r in enumerate(records)]
    assert load_problems(shifted(runs[opened], {3: 0.12}), opened, seed=5) == []
    assert "off its arrival time" in load_problems(shifted(runs[opened], {3: -0.12}), opened, seed=5)[0]
    assert "off its arrival time" in load_problems(shifted(runs[opened], {3: 0.12, 5: 0.12}), opened, seed=5)[0]
    assert "off its arrival time" in load_problems(shifted(runs[opened], {3: 0.31}), opened, seed=5)[0]
    # a failed request ends at its send: fewer in flight than the users is then no proof of another load
    failed = [RequestRecord(8, r.send_time, [], 0, False, "HTTP 503") if i else r for i, r in enumerate(runs[four])]
    assert in_flight_peak(failed) < 4 and load_problems(failed, four, seed=3) == []
