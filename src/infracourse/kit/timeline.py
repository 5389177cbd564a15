"""Week 3's timelines: seeded training-step traces in the Chrome trace-event format that torch.profiler exports
(complete events: `ph` "X", `ts` and `dur` in microseconds, `cat`, `name`, `tid`), for a learner to classify
into data wait / transfer / launch / compute.

Each step waits for its batch on the host (a DataLoader event), copies it to the device (a runtime call on the
host and a copy on the device), then launches kernels one by one (runtime calls on the host; each kernel runs
on the device when launched and the device is free). Some steps are launch-bound (kernels shorter than their
launches), some compute-bound. Only the generator lives here; the grader classifies with its own code."""
from __future__ import annotations

import random

KERNELS = ("ampere_sgemm_128x64_nn", "vectorized_elementwise_kernel", "reduce_kernel", "softmax_warp_forward")


def training_trace(seed: int, steps: int = 6) -> list[dict]:
    """Events of `steps` training steps on one host thread (tid 1) and one device stream (tid 7)."""
    rng = random.Random(seed)
    events: list[dict] = []
    host = device = 0.0

    def add(cat, name, tid, ts, dur):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": round(ts, 3),
                       "dur": round(dur, 3)})

    for step in range(steps):
        launch_bound = rng.random() < 0.4
        wait = rng.uniform(50, 800)
        add("cpu_op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1, host, wait)
        host += wait + rng.uniform(1, 10)
        call = rng.uniform(5, 15)
        add("cuda_runtime", "cudaMemcpyAsync", 1, host, call)
        copy = rng.uniform(30, 300)
        start = max(host + call * 0.5, device)
        add("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 7, start, copy)
        device = start + copy
        host += call + rng.uniform(1, 5)
        for _ in range(rng.randint(4, 12)):
            call = rng.uniform(4, 12)
            add("cuda_runtime", "cudaLaunchKernel", 1, host, call)
            kernel = rng.uniform(1, 6) if launch_bound else rng.uniform(20, 400)
            start = max(host + call * 0.8, device)
            add("kernel", rng.choice(KERNELS), 7, start, kernel)
            device = start + kernel
            host += call + rng.uniform(0.5, 3)
        if rng.random() < 0.5:  # the optimiser reads a loss: the host waits for the device
            host = max(host, device) + rng.uniform(2, 20)
    rng.shuffle(events)  # a trace file's order is not time order
    return events
