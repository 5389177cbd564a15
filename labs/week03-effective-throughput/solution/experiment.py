"""Week 3: how busy the device is against how much useful work it does, and a latency / throughput /
concurrency table for a small batching server (reference solution).

`python experiment.py` prints both for padding and packing.
"""
from __future__ import annotations

import queue
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np
import torch

from schemes import pack, pad, run


def _sync_for(model) -> Callable[[], None]:
    """What 'wait for the device' means for this model: torch.cuda.synchronize on a GPU, else nothing."""
    on_gpu = next(model.parameters()).is_cuda
    return torch.cuda.synchronize if on_gpu else (lambda: None)


def measure(scheme, model, batches: list[list[torch.Tensor]], *, warmup: int = 2) -> dict:
    """Run every batch through `scheme` after `warmup` untimed batches.

    utilisation: the share of the wall clock the model was computing (what a device's busy counter shows);
    tokens_per_s: every position computed, padding included; useful_tokens_per_s: real tokens only;
    samples_s: the raw data, each timed batch's time in the model call, in order; wall_s: the loop's clock.
    """
    sync = _sync_for(model)
    for seqs in batches[:warmup]:
        run(scheme, model, seqs)
    sync()
    samples, computed, useful = [], 0, 0
    start = time.perf_counter()
    for seqs in batches:
        tokens, unpack = scheme(seqs)  # preparing the batch: the device waits meanwhile
        t0 = time.perf_counter()
        unpack(model(tokens))
        sync()
        samples.append(time.perf_counter() - t0)
        computed += tokens.numel()
        useful += sum(len(s) for s in seqs)
    wall = time.perf_counter() - start
    return {"utilisation": sum(samples) / wall, "tokens_per_s": computed / wall,
            "useful_tokens_per_s": useful / wall, "samples_s": samples, "wall_s": wall}


def serve(scheme, model, sequences: list[torch.Tensor], *, concurrency: int, max_batch: int,
          per_client: int) -> dict:
    """`concurrency` clients, each sending `per_client` requests one after another (a closed loop), to a
    server thread that batches up to `max_batch` waiting requests. Latency runs from submitting a request to
    receiving its answer, queueing included; throughput is requests per second of the whole run."""
    sync = _sync_for(model)
    inbox: queue.Queue = queue.Queue()

    def server():
        while (first := inbox.get()) is not None:
            batch = [first]
            while len(batch) < max_batch:
                try:
                    batch.append(inbox.get_nowait())
                except queue.Empty:
                    break
            started = time.perf_counter()
            try:
                run(scheme, model, [seq for seq, _ in batch])
                sync()
            except Exception as exc:  # a client must never wait forever for a batch that failed
                for _, reply in batch:
                    reply.set_exception(exc)
                continue
            finished = time.perf_counter()
            for _, reply in batch:
                reply.set_result((started, finished))

    ready = threading.Barrier(concurrency)
    window = []  # (first submit, last answer) of each client: the run is the span of all of them

    def client(k: int) -> list[float]:
        latencies = []
        ready.wait()  # all clients start together: none runs alone while the others are being created
        first = time.perf_counter()
        for i in range(per_client):
            reply: Future = Future()
            submitted = time.perf_counter()
            inbox.put((sequences[(k * per_client + i) % len(sequences)], reply))
            started, finished = reply.result()  # when the server began and ended this request's batch
            latencies.append(time.perf_counter() - submitted)  # what the client waited: queueing included
        window.append((first, time.perf_counter()))
        return latencies

    worker = threading.Thread(target=server, daemon=True)
    worker.start()
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            latencies = [x for per in pool.map(client, range(concurrency)) for x in per]
        wall = max(end for _, end in window) - min(start for start, _ in window)  # thread start-up excluded
    finally:
        inbox.put(None)
        worker.join()
    return {"concurrency": concurrency, "throughput_rps": len(latencies) / wall,
            "mean_latency_s": statistics.fmean(latencies), "p99_latency_s": float(np.percentile(latencies, 99)),
            "latencies_s": latencies}


def latency_table(scheme, model, sequences: list[torch.Tensor], concurrencies: list[int], *, max_batch: int = 4,
                  per_client: int = 10) -> list[dict]:
    """One `serve` row per concurrency level."""
    return [serve(scheme, model, sequences, concurrency=c, max_batch=max_batch, per_client=per_client)
            for c in concurrencies]


TIMELINE_KEYS = ("data_wait_s", "transfer_s", "launch_s", "compute_s", "idle_s")
BY_PRIORITY = ("compute_s", "transfer_s", "data_wait_s", "launch_s")  # what the device computes wins


def _class_of(event: dict) -> int | None:
    """0 compute, 1 transfer, 2 data wait, 3 launch (the order of priority); None for anything else."""
    if event["cat"] == "kernel":
        return 0
    if event["cat"] == "gpu_memcpy":
        return 1
    if "DataLoader" in event["name"]:
        return 2
    if event["cat"] == "cuda_runtime":
        return 3
    return None


def classify_timeline(events: list[dict]) -> dict:
    """Seconds of the trace's span spent in each class: a sweep over the sorted start and end points, keeping a
    count of the open events of each class; each stretch goes to the highest-priority class open in it."""
    points = []
    for e in events:
        if e.get("ph") == "X" and (kind := _class_of(e)) is not None:
            points += [(e["ts"], 1, kind), (e["ts"] + e["dur"], -1, kind)]
        elif e.get("ph") == "X":
            points += [(e["ts"], 0, None), (e["ts"] + e["dur"], 0, None)]  # widens the span only
    out = dict.fromkeys(TIMELINE_KEYS, 0.0)
    if not points:
        return out
    points.sort(key=lambda p: p[0])
    open_ = [0, 0, 0, 0]
    previous = points[0][0]
    for t, delta, kind in points:
        if t > previous:
            active = next((i for i in range(4) if open_[i]), None)
            out[BY_PRIORITY[active] if active is not None else "idle_s"] += (t - previous) / 1e6
            previous = t
        if kind is not None:
            open_[kind] += delta
    return out


def main() -> None:
    import argparse
    import json

    from infracourse.kit.gpt import GPTConfig
    from infracourse.kit.sequences import TokenModel, random_batches

    parser = argparse.ArgumentParser(description="Week 3: utilisation, useful throughput, and a latency table")
    parser.add_argument("--raw", metavar="FILE", help="also write the raw data behind the figures, as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier figures on a small shared machine
    model = TokenModel(GPTConfig(vocab_size=256, d_model=128, n_layer=2))
    batches = random_batches(8, 16, vocab=256, seed=0)
    padded, useful = sum(len(b) * max(map(len, b)) for b in batches), sum(len(s) for b in batches for s in b)
    print(f"padding computes {padded / useful:.2f}x the useful tokens")
    raw = {"padding_factor": padded / useful, "measure": {}, "table": {}}
    for name, scheme in (("pad", pad), ("pack", pack)):
        r = raw["measure"][name] = measure(scheme, model, batches)
        print(f"{name:>5}: utilisation {r['utilisation']:.0%}, {r['tokens_per_s']:,.0f} tokens/s, "
              f"{r['useful_tokens_per_s']:,.0f} useful tokens/s")
    sequences = [s for b in batches for s in b]
    print("scheme  concurrency  throughput/s  mean latency ms  p99 ms  throughput x latency")
    for name, scheme in (("pad", pad), ("pack", pack)):
        raw["table"][name] = latency_table(scheme, model, sequences, [1, 2, 4, 8, 16], max_batch=4)
        for row in raw["table"][name]:
            print(f"{name:>6} {row['concurrency']:12d} {row['throughput_rps']:13.1f} "
                  f"{row['mean_latency_s'] * 1e3:16.2f} {row['p99_latency_s'] * 1e3:7.2f} "
                  f"{row['throughput_rps'] * row['mean_latency_s']:21.2f}")
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(raw, f)

if __name__ == "__main__":
    main()
