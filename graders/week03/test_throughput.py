"""Week 3 throughput: packing must deliver the useful-token gain the length distribution allows, and the
learner's measurement must report utilisation and effective throughput, which tell different stories."""
import math
import time

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from infracourse.grader import LabCheckFailed, WrongOutput
from infracourse.kit import sequences


KEYS = ("utilisation", "tokens_per_s", "useful_tokens_per_s")


ROUNDS = 5  # rounds of back-to-back passes: the padded baseline, then the learner's packing


def _timed_rounds(padded, packed, worker, device):
    """ROUNDS rounds of back-to-back passes, the padded baseline then the packing: per side, each pass's host
    wall clock (the device drained inside it: the effective throughput a caller sees, host preparation
    included) and its CPU seconds (the judge's own thread for its padding; the worker's processes, read from
    the kernel's accounting, for the packing)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sides = [(padded, time.thread_time), (packed, worker.cpu_seconds)]
    wall, cpu = [[], []], [[], []]
    for round_ in range(ROUNDS):
        for i, (fn, cpu_clock) in enumerate(sides):
            if round_ == 0:
                fn()  # warm-up
                sync()
            c0, t0 = cpu_clock(), time.perf_counter()
            fn()
            sync()
            t1, c1 = time.perf_counter(), cpu_clock()
            wall[i].append(t1 - t0)
            cpu[i].append(None if c0 is None or c1 is None else c1 - c0)
    return wall, cpu


@pytest.mark.check("effective-gain")
def test_effective_gain(schemes, workload, learner, device, lab_check, record):
    model, batches = workload.model, workload.batches

    def padded():  # the grader's own padding, in its own process: the learner's code cannot slow it down
        for seqs in batches:
            model(pad_sequence(seqs, batch_first=True))

    # The learner's pack runs in the worker, beside the worker's copy of the model, a whole pass per request:
    # clocked here, it carries one round trip per pass (well under 1 % of a pass) and nothing else.
    packed = learner.build(sequences.SchemeLoop, schemes.pack, workload.remote_model, batches)
    wall, cpu = _timed_rounds(padded, packed, learner.worker, device)
    _require_timed_outputs(packed.digest(), model, batches)
    # Same useful tokens on both sides, so the gain is a ratio of times. On a GPU: the fastest drained pass of
    # each side. On a CPU the work is CPU time, which other load on a shared machine leaves nearly alone while
    # it stretches the wall clock of a 25 ms pass by half: the fastest pass of each side in CPU seconds, with
    # the wall-clock gain held to half the factor as well (work moved out of sight of the accounting still
    # shows on the wall).
    wall_gain = min(wall[0]) / min(wall[1])
    cpu_gain = None
    if device == "cpu" and all(x is not None and x > 0 for side in cpu for x in side):
        cpu_gain = min(cpu[0]) / min(cpu[1])
    gain = wall_gain if cpu_gain is None else cpu_gain
    target = lab_check.threshold * workload.factor
    record("useful-token gain", gain, target=target, unit="x")
    record("wall-clock gain", wall_gain, unit="x")
    record("factor the lengths allow", workload.factor, unit="x")
    if cpu_gain is not None and wall_gain < 0.5 * workload.factor:
        raise LabCheckFailed(
            f"in CPU time your packing delivers {cpu_gain:.2f}x the useful tokens per second of padding, but on the "
            f"wall clock only {wall_gain:.2f}x (at least half the factor, {0.5 * workload.factor:.2f}x, expected): "
            "the work must be done in the pass that is timed, in the grading worker's own threads")
    if gain < target:
        positions = sum(schemes.pack(seqs)[0].numel() for seqs in batches) / workload.useful_tokens
        raise LabCheckFailed(
            f"padding these batches computes {workload.factor:.2f}x the useful tokens, so packing could deliver up to "
            f"{workload.factor:.2f}x the useful tokens per second; yours delivers {gain:.2f}x (target "
            f"{lab_check.threshold:.0%} of the factor, {target:.2f}x). Your pack hands the model {positions:.2f} "
            "positions per real token (1.00 is the goal): concatenate the sequences with one torch.cat, no padding, "
            "and keep per-sequence Python work out of the batch.")


def _require_timed_outputs(digest, model, batches):
    """The outputs of the last timed pass are the model's outputs for each sequence alone: a pack that is exact
    when checked for correctness but computes less while clocked fails here (compared by shape and sum, which
    the grader recomputes with its own copy of the model)."""
    for b, (seqs, outputs) in enumerate(zip(batches, list(digest) + [[]] * len(batches))):
        if len(outputs) != len(seqs):
            raise WrongOutput(f"in the timed passes, unpack returned {len(outputs)} outputs for the {len(seqs)} "
                                 f"sequences of batch {b}: the clocked pack must be the same exact scheme as the "
                                 "one checked for correctness")
        for i, (seq, (shape, total)) in enumerate(zip(seqs, outputs)):
            want = model(seq).double()
            expected = float(want.sum())
            if shape != tuple(want.shape) or not math.isclose(total, expected, rel_tol=1e-4,
                                                              abs_tol=1e-4 * float(want.abs().sum()) + 1e-6):
                raise WrongOutput(
                    f"in the timed passes, sequence {i} of batch {b} came back with shape {shape} and sum "
                    f"{total:.6g}, but the model's output for it alone has shape {tuple(want.shape)} and sum "
                    f"{expected:.6g}: the throughput was measured on outputs that are wrong. The clocked pack must "
                    "compute every real token, exactly as when it is checked for correctness")


def _require_raw_data(name, result, timed, repeats, useful_tokens):
    """The summary recomputes from the raw data measure() returns, one sample per timed batch; each sample holds
    at least the model's own (stamped) time for that batch, so the samples are measured, not invented."""
    samples, wall = result.get("samples_s"), result.get("wall_s")
    if not (isinstance(samples, (list, tuple)) and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0
                                                       for x in samples)) \
            or not (isinstance(wall, (int, float)) and math.isfinite(wall) and wall > 0):
        raise LabCheckFailed(f"measure(schemes.{name}, ...) must also return its raw data: samples_s (a list with "
                             "each timed batch's seconds in the model call, in order) and wall_s (the timed loop's "
                             "seconds)")
    if len(samples) != repeats:
        raise LabCheckFailed(f"{name}: samples_s holds {len(samples)} samples, but {repeats} batches were timed: "
                             "one sample per timed batch (the repetition count is the number of samples)")
    short = [i for i, (x, (start, end, _)) in enumerate(zip(samples, timed)) if x < 0.95 * (end - start) - 1e-4]
    if short:
        i = short[0]
        raise LabCheckFailed(
            f"{name}: samples_s[{i}] is {samples[i] * 1e3:.3f} ms, but the model alone computed batch {i} for "
            f"{(timed[i][1] - timed[i][0]) * 1e3:.3f} ms: each sample must be measured around that batch's model call")
    for key, value in (("utilisation", sum(samples) / wall),
                       ("useful_tokens_per_s", useful_tokens / wall)):
        if not math.isclose(result[key], value, rel_tol=0.01):
            raise LabCheckFailed(f"{name}: {key} {result[key]:.4g} does not recompute from your raw data "
                                 f"(samples_s and wall_s give {value:.4g}): report the summary of what you measured")


def _positions(name, batches):
    """What each batch costs the model: padding computes B x L_max positions, packing the real tokens."""
    return [len(b) * max(len(s) for s in b) if name == "pad" else sum(len(s) for s in b) for b in batches]


@pytest.mark.check("utilisation-reported")
def test_utilisation_and_effective_throughput(schemes, experiment, workload, learner, record):
    # The course's model, stamped in the worker: the learner's figures are compared with what it really did.
    model = learner.build(sequences.StampedModel, workload.remote_model)
    batches, results = workload.batches, {}
    for name, expected_ratio in (("pad", workload.factor), ("pack", 1.0)):
        model.take()
        t0 = time.perf_counter()
        result = experiment.measure(getattr(schemes, name), model, batches)
        call_s = time.perf_counter() - t0
        calls = model.take()
        if not isinstance(result, dict):
            raise LabCheckFailed(f"measure(schemes.{name}, ...) returned {type(result).__name__}: return a dict")
        missing = [k for k in KEYS if not isinstance(result.get(k), (int, float)) or not math.isfinite(result[k])]
        if missing:
            raise LabCheckFailed(f"measure(schemes.{name}, ...) must return numbers for {list(KEYS)}; missing {missing}")
        if not 0 < result["utilisation"] <= 1.001:
            raise LabCheckFailed(f"{name}: utilisation {result['utilisation']} is not a share of the wall clock (0..1)")
        timed = calls[-len(batches):]
        if [p for _, _, p in timed] != _positions(name, batches):
            raise LabCheckFailed(
                f"{name}: the model computed {[p for _, _, p in calls]} positions in {len(calls)} call(s), but "
                f"measure must end with each of the {len(batches)} batches through the model once, in order "
                f"({_positions(name, batches)} positions): run the warm-up batches first, then every batch, timed.")
        _require_raw_data(name, result, timed, len(batches), workload.useful_tokens)
        ratio = result["tokens_per_s"] / result["useful_tokens_per_s"]
        if abs(ratio - expected_ratio) > 0.02 * expected_ratio:
            raise LabCheckFailed(
                f"{name}: tokens_per_s / useful_tokens_per_s is {ratio:.3f}, but this scheme computes "
                f"{expected_ratio:.3f} positions per real token on these batches. Count every position the model "
                "computed in tokens_per_s and only the sequences' own tokens in useful_tokens_per_s.")
        # The wall clock the learner's figures imply, against the span in which the model ran the timed batches
        # (stamped by the model) and the whole call (clocked here, warm-up and round trip included).
        wall = workload.useful_tokens / result["useful_tokens_per_s"]
        span = timed[-1][1] - timed[0][0]
        busy = sum(end - start for start, end, _ in timed)
        record(f"{name} wall implied", wall * 1e3, target=span * 1e3, unit="ms", target_is="re-measured")
        if not 0.95 * span <= wall <= call_s:
            raise LabCheckFailed(
                f"{name}: your useful_tokens_per_s implies the {len(batches)} batches took {wall * 1e3:.2f} ms, but the "
                f"model alone ran from the first timed batch to the last for {span * 1e3:.2f} ms, and the whole "
                f"measure call took {call_s * 1e3:.2f} ms. Divide the tokens by the wall clock of the timed loop, "
                "measured around it.")
        # One-sided: the learner's busy time holds the model calls the stamps cover, plus the sync and unpack and
        # any preemption around them (a loaded machine put 100 % against the stamps' 84 % for an honest pack).
        if result["utilisation"] < busy / wall - 0.1:
            raise LabCheckFailed(
                f"{name}: you report utilisation {result['utilisation']:.0%}, but the model computed for "
                f"{busy * 1e3:.2f} ms of the {wall * 1e3:.2f} ms your throughput implies ({busy / wall:.0%}). "
                "Utilisation is the time inside the model calls over the timed loop's wall clock.")
        record(f"{name} utilisation", result["utilisation"], target=busy / wall, target_is="re-measured")
        record(f"{name} useful tokens/s", result["useful_tokens_per_s"], unit="tokens/s")
        results[name] = result
    if results["pad"]["utilisation"] < 0.5:
        raise LabCheckFailed(f"padding kept the model busy {results['pad']['utilisation']:.0%} of the time: time only "
                             "the model call (preparing the batch is host work) and divide by the whole loop's wall clock")
    if results["pad"]["useful_tokens_per_s"] >= results["pack"]["useful_tokens_per_s"]:
        raise LabCheckFailed("padding reports at least as many useful tokens/s as packing, though it computes "
                             f"{workload.factor:.2f}x more positions for the same tokens: check what is counted and timed")
