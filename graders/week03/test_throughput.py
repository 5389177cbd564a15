"""Week 3 throughput: packing must deliver the useful-token gain the length distribution allows, and the
learner's measurement must report utilisation and effective throughput, which tell different stories."""
import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from infracourse import bench
from infracourse.grading.remote import WorkerObject
from infracourse.guard import LabCheckFailed

KEYS = ("utilisation", "tokens_per_s", "useful_tokens_per_s")


def _wall_seconds(fn, device):
    """Seconds for fn() on the host clock, the device drained inside the timed call: the effective
    throughput a caller sees (host preparation included), not device time alone."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def call():
        fn()
        sync()

    return bench.measure(call, warmup=1, reps=5, flush_l2=False, device="cpu").median_s


@pytest.mark.check("effective-gain")
def test_effective_gain(schemes, workload, learner, device, lab_check, record):
    model, batches = workload.model, workload.batches

    def padded():  # the grader's own padding, in its own process: the learner's code cannot slow it down
        for seqs in batches:
            model(pad_sequence(seqs, batch_first=True))

    # The learner's pack runs in the worker, beside the worker's copy of the model, a whole pass per request:
    # clocked here, it carries one round trip per pass (well under 1 % of a pass) and nothing else.
    packed = learner.worker.build(WorkerObject("infracourse.kit.sequences:SchemeLoop",
                                               (schemes.pack, workload.remote_model, batches)))
    gain = _wall_seconds(padded, device) / _wall_seconds(packed, device)  # same useful tokens in both
    target = lab_check.threshold * workload.factor
    record("useful-token gain", gain, target=target, unit="x")
    record("factor the lengths allow", workload.factor, unit="x")
    if gain < target:
        positions = sum(schemes.pack(seqs)[0].numel() for seqs in batches) / workload.useful_tokens
        raise LabCheckFailed(
            f"padding these batches computes {workload.factor:.2f}x the useful tokens, so packing could deliver up to "
            f"{workload.factor:.2f}x the useful tokens per second; yours delivers {gain:.2f}x (target "
            f"{lab_check.threshold:.0%} of the factor, {target:.2f}x). Your pack hands the model {positions:.2f} "
            "positions per real token (1.00 is the goal): concatenate the sequences with one torch.cat, no padding, "
            "and keep per-sequence Python work out of the batch.")


@pytest.mark.check("utilisation-reported")
def test_utilisation_and_effective_throughput(schemes, experiment, workload, record):
    results = {}
    for name, expected_ratio in (("pad", workload.factor), ("pack", 1.0)):
        result = experiment.measure(getattr(schemes, name), workload.remote_model, workload.batches)
        missing = [k for k in KEYS if not isinstance(result.get(k), (int, float)) or not math.isfinite(result[k])]
        if missing:
            raise LabCheckFailed(f"measure(schemes.{name}, ...) must return numbers for {list(KEYS)}; missing {missing}")
        if not 0 < result["utilisation"] <= 1.001:
            raise LabCheckFailed(f"{name}: utilisation {result['utilisation']} is not a share of the wall clock (0..1)")
        ratio = result["tokens_per_s"] / result["useful_tokens_per_s"]
        if abs(ratio - expected_ratio) > 0.02 * expected_ratio:
            raise LabCheckFailed(
                f"{name}: tokens_per_s / useful_tokens_per_s is {ratio:.3f}, but this scheme computes "
                f"{expected_ratio:.3f} positions per real token on these batches. Count every position the model "
                "computed in tokens_per_s and only the sequences' own tokens in useful_tokens_per_s.")
        record(f"{name} utilisation", result["utilisation"])
        record(f"{name} useful tokens/s", result["useful_tokens_per_s"], unit="tokens/s")
        results[name] = result
    if results["pad"]["utilisation"] < 0.5:
        raise LabCheckFailed(f"padding kept the model busy {results['pad']['utilisation']:.0%} of the time: time only "
                             "the model call (preparing the batch is host work) and divide by the whole loop's wall clock")
    if results["pad"]["useful_tokens_per_s"] >= results["pack"]["useful_tokens_per_s"]:
        raise LabCheckFailed("padding reports at least as many useful tokens/s as packing, though it computes "
                             f"{workload.factor:.2f}x more positions for the same tokens: check what is counted and timed")
