"""Week 3: how busy the device is against how much useful work it does, and a latency / throughput /
concurrency table for a small batching server.

`python experiment.py` prints both for padding and packing.
"""
from __future__ import annotations

import queue  # noqa: F401  (the server's inbox)
import threading  # noqa: F401
import time  # noqa: F401
from concurrent.futures import Future, ThreadPoolExecutor  # noqa: F401
from typing import Callable

import torch

from schemes import pack, pad, run  # noqa: F401  (run: a scheme, a model and a batch in one call)


def _sync_for(model) -> Callable[[], None]:
    """What 'wait for the device' means for this model: torch.cuda.synchronize on a GPU, else nothing."""
    on_gpu = next(model.parameters()).is_cuda
    return torch.cuda.synchronize if on_gpu else (lambda: None)


def measure(scheme, model, batches: list[list[torch.Tensor]], *, warmup: int = 2) -> dict:
    """Run every batch through `scheme` after `warmup` untimed batches. Return utilisation (the share of the
    loop's wall clock spent in the model call), tokens_per_s (every computed position, padding included) and
    useful_tokens_per_s (the sequences' own tokens), with the raw data they come from: samples_s (each timed
    batch's seconds in the model call, in order) and wall_s (the timed loop's seconds)."""
    # TODO(week03): time model(tokens) (then _sync_for(model)()) as busy time and the whole loop as wall time.
    raise NotImplementedError("measure(): time the model calls and the loop; count computed and useful tokens")


def latency_table(scheme, model, sequences: list[torch.Tensor], concurrencies: list[int], *, max_batch: int = 4,
                  per_client: int = 10) -> list[dict]:
    """For each concurrency c: c client threads each send per_client requests (one sequence each) one after
    another to a server thread that runs up to max_batch waiting requests at once through `scheme`.
    Return one row per c: concurrency, throughput_rps, mean_latency_s, p99_latency_s, and latencies_s (the raw
    latency of every request, from which the mean and p99 recompute)."""
    # TODO(week03): a queue.Queue inbox, a server thread, Futures for the answers, a ThreadPoolExecutor of
    # clients. Latency: from submit to answer. Throughput: requests over the span the clients were sending.
    raise NotImplementedError("latency_table(): serve the requests and measure latency and throughput")


def classify_timeline(events: list[dict]) -> dict:
    """Seconds of the trace's span in data_wait_s, transfer_s, launch_s, compute_s and idle_s (see the handout)."""
    # TODO(week03): sort the events' start and end points; give each stretch between two points to the
    # highest-priority class open during it (compute, transfer, data wait, launch), else to idle.
    raise NotImplementedError("classify_timeline(): attribute the trace's span to data wait/transfer/launch/compute")


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
