"""Your int8 Linear serving a checkpoint: the course writes a Llama-style checkpoint in the worker, loads it, and
swaps your Int8Linear(linear) into every projection of every layer (kit.quant_serving.quantized_llama); the
same checkpoint in full precision is served beside it, on the same prompts, by the same decode loop.

quant-serving      any machine (fp32 checkpoint): the int8 model's tokens follow the course's int8 reference; the
                   bytes it holds are counted by the judge from the tensors the model keeps alive (parameters,
                   buffers and tensors in plain attributes, fetched: not its state_dict's word); its layer
                   Linears at least lab.yaml's factor smaller than fp32; prefill and decode of both models timed
                   by the course's harness (grading.perf.timed) on the same prompts. On a CPU the times are
                   labelled a CPU stand-in.
gpu-quant-serving  needs cuda: the 1.0 B-parameter checkpoint in bf16 on the device; the int8 model's device
                   memory is what the device's allocator gave it (torch.cuda.memory_allocated in the serving
                   process, with the judge's reading of the device beside it), against the bf16 model's; decode
                   latency of both, same prompts.
"""
import pytest
import torch

from infracourse.grader import LabCheckFailed, LearnerRaised, in_worker, timed
from infracourse.kit import llama_serving
from infracourse.kit.llama import checkpoint_model
from infracourse.kit.llama_serving import greedy_mismatch, prompt_batches, weight_bytes
from infracourse.kit.quant_serving import (LlamaGenerate, held_bytes, held_tensors, layer_linears, quantized_llama,
                                           reference_int8_llama)
from week18_judging import require

SMALL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "intermediate": 256,
         "max_positions": 128}
GPU = {"layers": 8, "hidden": 3072, "heads": 24, "kv_heads": 8, "vocab": 32000, "intermediate": 8192,
       "max_positions": 2048}
CPU_PLAN = {"batch": 1, "prompt": 16, "new": 4, "tol": 1e-3, "budget_s": 0.05}
GPU_PLAN = {"batch": 8, "prompt": 256, "new": 16, "tol": 8e-2, "budget_s": 0.3}
GPU_FACTOR = 1.8  # bf16 -> int8 + one scale per row: about 2x


@pytest.fixture(scope="module")
def quant(learner):
    return learner.module("quant")


def served_pair(quant, learner, sizes, seed, dtype, device):
    """(judge's full-precision model, judge's int8 reference, worker's full-precision model, worker's int8 model)."""
    local = checkpoint_model(sizes, seed, dtype, device)
    remote = learner.build(checkpoint_model, sizes, seed, dtype, device)
    try:
        qremote = learner.build(quantized_llama, remote, quant.Int8Linear)
    except LearnerRaised as exc:
        raise LabCheckFailed(f"Int8Linear(linear) on the checkpoint's projections raised {exc}: it must take any "
                             "bias-free nn.Linear (q/k/v/o_proj, gate/up/down_proj of a Llama layer)") from None
    return local, reference_int8_llama(local), remote, qremote


def phase_times(learner, model, reference, plan, seed, label, what):
    """prefill and decode per step of kit.llama.generate on `model`, timed on the plan's prompts (the same prompts
    for every model: one seed), every picked timed output following `reference`."""
    times = {}
    for n in (1, plan["new"]):
        def check(out, args, n=n):
            problem = greedy_mismatch(reference, args[0], out, n, plan["tol"])
            if problem:
                raise LabCheckFailed(f"{what}: a timed call of the {label} model: {problem}")
        call = learner.build(LlamaGenerate, model, n)
        spec = in_worker(prompt_batches, reference.cfg.vocab, plan["batch"], plan["prompt"], seed=seed)
        times[n] = timed(call, spec, check=check, label=f"{label} generate, {what}", calls=4,
                         budget_s=plan["budget_s"]).seconds
    return times[1], (times[plan["new"]] - times[1]) / (plan["new"] - 1)


def judge_held(learner, qremote, local, what):
    """(bytes the int8 model holds, its device bytes, bytes of its layer Linears by the judge's count)."""
    tensors = learner.build(held_tensors, qremote)
    require(isinstance(tensors, list) and all(isinstance(t, torch.Tensor) for t in tensors),
            f"{what}: the int8 model's tensors did not come back")
    held = held_bytes(tensors)
    full = held_bytes(held_tensors(local))["bytes"]
    linear = held_bytes(t.weight for t in layer_linears(local).values())["bytes"]
    return held, full, linear


def record_times(record, name, prefill, decode, source, what):
    tag = " (CPU stand-in)" if source == "cpu-stand-in" else ""
    record(f"prefill {name}{tag}", prefill * 1e3, unit="ms", seconds=prefill, source=source, model=what)
    record(f"decode step {name}{tag}", decode * 1e3, unit="ms", seconds=max(decode, 0.0), source=source, model=what)


@pytest.mark.check("quant-serving")
def test_int8_checkpoint_served_and_measured(quant, learner, seed, device, record, lab_check):
    source = "device" if device == "cuda" else "cpu-stand-in"
    local, ref, remote, qremote = served_pair(quant, learner, SMALL, seed, "fp32", device)
    what = (f"seed {seed}: a {SMALL['layers']}-layer checkpoint (hidden {SMALL['hidden']}, {SMALL['heads']} heads "
            f"sharing {SMALL['kv_heads']} KV heads), fp32 and int8, batch {CPU_PLAN['batch']}, a "
            f"{CPU_PLAN['prompt']}-token prompt, {CPU_PLAN['new']} new tokens")
    prompts = prompt_batches(SMALL["vocab"], 2, CPU_PLAN["prompt"], seed=seed - 1)(0)[0]
    problem = greedy_mismatch(ref, prompts, learner.build(LlamaGenerate, qremote, CPU_PLAN["new"])(prompts),
                             CPU_PLAN["new"], CPU_PLAN["tol"])
    require(problem is None, f"{what}: the int8 model's tokens are not the course's int8 model's ({problem}): "
            "Int8Linear must compute with its int8 weights times their per-row scales")
    held, full, linear = judge_held(learner, qremote, local, what)
    rest = full - linear  # the embedding table, the norms and the LM head: kept in fp32
    factor = linear / max(held["bytes"] - rest, 1)
    record("fp32 model bytes held", full, unit="B", bytes=full)
    record("int8 model bytes held", held["bytes"], unit="B", bytes=held["bytes"],
           label="every tensor the model keeps alive, counted by the judge")
    record("layer Linear memory factor", factor, target=lab_check.threshold, unit="x")
    require(factor >= lab_check.threshold,
            f"{what}: the int8 model keeps {held['bytes']} bytes of tensors alive; less the fp32 embedding, norms "
            f"and head ({rest} bytes) its layer Linears take {held['bytes'] - rest} bytes against {linear} in fp32: "
            f"{factor:.2f}x smaller, at least {lab_check.threshold:g}x expected. Counted are the tensors the model "
            "holds, wherever it holds them (a list, a dict, a kept nn.Linear), not only its state_dict: keep no fp32 "
            "copy of a weight once it is quantised")
    for name, model, reference in (("fp32", remote, local), ("int8", qremote, ref)):
        prefill, decode = phase_times(learner, model, reference, CPU_PLAN, seed, name, what)
        record_times(record, name, prefill, decode, source, what)


@pytest.mark.check("gpu-quant-serving")
def test_int8_checkpoint_on_the_device(quant, learner, seed, record):
    local = checkpoint_model(GPU, seed, "bf16", "cuda")
    remote = learner.build(checkpoint_model, GPU, seed, "bf16", "cuda")
    what = (f"seed {seed}: a 1.0 B-parameter checkpoint in bf16 on the device and its int8 copy, batch "
            f"{GPU_PLAN['batch']}, {GPU_PLAN['prompt']}-token prompts, {GPU_PLAN['new']} new tokens")
    before = learner.build(llama_serving.reset_device_peak)
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    try:
        qremote = learner.build(quantized_llama, remote, quant.Int8Linear)
    except LearnerRaised as exc:
        raise LabCheckFailed(f"{what}: Int8Linear(linear) raised {exc}") from None
    after = learner.build(llama_serving.device_peak)["allocated"]
    free_after, _ = torch.cuda.mem_get_info()
    ref = reference_int8_llama(local)
    held, full, linear = judge_held(learner, qremote, local, what)
    int8_device = after - before  # what the device's allocator gave the int8 copy
    bf16_device = weight_bytes(local)
    rest = full - linear
    record("bf16 model device bytes", bf16_device, unit="B", source="device")
    record("int8 model device bytes", int8_device, unit="B", source="device",
           label="torch.cuda.memory_allocated of the serving process, taken around the int8 copy")
    require(held["device_bytes"] >= 0.99 * held["bytes"],
            f"{what}: the int8 model holds {held['bytes'] - held['device_bytes']} bytes off the device: on a GPU the "
            "served model lives in device memory; host memory is no device figure")
    require(int8_device >= 0.99 * held["device_bytes"] and free_before - free_after >= 0.9 * int8_device - 64 * 2**20,
            f"{what}: the allocator says the int8 copy took {int8_device} bytes, the device shows "
            f"{free_before - free_after} more in use, its tensors hold {held['device_bytes']}: not the device's figures")
    factor = linear / max(held["bytes"] - rest, 1)
    record("layer Linear memory factor against bf16", factor, target=GPU_FACTOR, unit="x")
    require(factor >= GPU_FACTOR, f"{what}: the int8 layer Linears take {held['bytes'] - rest} bytes against "
            f"{linear} in bf16: {factor:.2f}x, at least {GPU_FACTOR}x expected (one byte per weight + a scale per row)")
    for name, model, reference in (("bf16", remote, local), ("int8", qremote, ref)):
        prefill, decode = phase_times(learner, model, reference, GPU_PLAN, seed, name, what)
        record_times(record, name, prefill, decode, "device", what)
