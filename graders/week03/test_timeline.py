"""Week 3 timeline: a training step's trace classified into data wait / transfer / launch / compute.

The traces are seeded (kit.timeline.training_trace, Chrome trace events as torch.profiler exports them); the
learner's classify_timeline runs in the worker, and the grader classifies the same events with its own code
below, by the handout's rule."""
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.timeline import training_trace

KEYS = ("data_wait_s", "transfer_s", "launch_s", "compute_s", "idle_s")


def _kind(event):
    """The handout's classes, in order of priority: what the device computes wins over everything else."""
    cat, name = event.get("cat", ""), event.get("name", "")
    if cat == "kernel":
        return 0, "compute_s"
    if cat == "gpu_memcpy":
        return 1, "transfer_s"
    if "DataLoader" in name:
        return 2, "data_wait_s"
    if cat == "cuda_runtime":
        return 3, "launch_s"
    return None


def classify(events):
    """Each microsecond of the trace's span goes to the highest-priority class active then, else to idle."""
    spans = [(e["ts"], e["ts"] + e["dur"], _kind(e)) for e in events if e.get("ph") == "X"]
    if not spans:
        return dict.fromkeys(KEYS, 0.0)
    out = dict.fromkeys(KEYS, 0.0)
    cuts = sorted({t for start, end, _ in spans for t in (start, end)})
    for lo, hi in zip(cuts, cuts[1:]):
        active = [kind for start, end, kind in spans if kind and start <= lo and end >= hi]
        out[min(active)[1] if active else "idle_s"] += (hi - lo) / 1e6
    return out


@pytest.mark.check("timeline")
def test_classify_timeline(experiment, seed, record):
    for k in range(3):
        events = training_trace(seed + k, steps=4 + k)
        got = experiment.classify_timeline(events)
        want = classify(events)
        if not isinstance(got, dict) or any(not isinstance(got.get(key), (int, float)) for key in KEYS):
            raise LabCheckFailed(f"classify_timeline must return a dict with numbers for {list(KEYS)} (seconds); "
                                 f"it returned {got!r:.120}")
        for key in KEYS:
            if abs(got[key] - want[key]) > 1e-9 + 1e-6 * want[key]:
                raise LabCheckFailed(
                    f"trace {k} (seed {seed + k}, {len(events)} events): {key} is {got[key] * 1e6:.3f} us, expected "
                    f"{want[key] * 1e6:.3f} us. Attribute every instant of the trace's span (first start to last "
                    "end) to one class: compute while a kernel runs, else transfer while a copy runs, else data "
                    "wait while the host waits for data, else launch while the host is in a runtime call, else "
                    "idle. Events overlap and arrive in any order.")
        record(f"trace {k} compute share", want["compute_s"] / sum(want.values()))
