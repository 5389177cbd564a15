"""Your cache serving a checkpoint, timed: prefill and decode at several prompt lengths and batch sizes.

The course writes a Llama-style checkpoint (kit.hf_checkpoint) in the worker and loads it on the grade's device;
your generate serves batches of B equal-length prompts. Each (batch, prompt length) is timed twice by the course's
one harness (grading.perf.timed: the judge's clock around a batch of calls, fresh prompts per call, drawn inside
that clock, outputs picked after it checked here against the judge's own copy of the model):
  prefill_ms         = time of generate(model, prompts, 1): the prompts' forward and the first token
  decode_ms_per_step = (time of generate(model, prompts, NEW) - prefill) / (NEW - 1): one step = B new tokens
Beside each row: a decode step's FLOPs and bytes (kit.llama_serving.decode_flops / decode_bytes), their ratio,
and on a GPU the device's ridge point (calibrated peak FLOP/s over copy bandwidth): below it decode is bound by
memory bandwidth, and the batch at which it turns compute-bound follows from the formulas.

phase-times   any machine, the tiny checkpoint: on a CPU every figure is labelled a CPU stand-in (no device).
gpu-serving   needs cuda: a 1.0 B-parameter bf16 checkpoint on the device; the memory figures are the device's
              (the serving process's torch.cuda allocator, with the judge's reading of the device beside it),
              against the KV-bytes formula at bf16.
"""
import pytest
import torch

from infracourse.grader import LabCheckFailed, LearnerRaised, in_worker, timed
from infracourse.kit import llama_serving
from infracourse.kit.hf_checkpoint import LlamaConfig
from infracourse.kit.llama import checkpoint_model
from infracourse.kit.llama_serving import GenerateCall, greedy_mismatch, prompt_batches, roofline, weight_bytes
from week15_judging import GPU_CHECKPOINT, SMALL_CHECKPOINT, check_device_memory

# (batch, prompt length) pairs: on a CPU an L of three (two lengths at batch 1, two batches at the short length:
# each timing costs the harness ~0.9 s of fixed work here), on a GPU the full grid
CPU_PLAN = {"cells": ((1, 8), (1, 24), (3, 8)), "new": 6, "tol": 1e-4, "budget_s": 0.05}
# bf16 on the GPU: the cached decode and the judge's one forward over the whole text round differently (logits
# below 8, an ulp 0.03); the reference's batch of 16 x 1024 tokens took a token 0.094 below the best on an H100
# (2026-12-07), so 0.25 as week 18's serving check; a wrong cache misses by whole logits
GPU_PLAN = {"cells": ((1, 128), (1, 1024), (16, 128), (16, 1024)), "new": 16, "tol": 0.25, "budget_s": 0.3}


def serve(kv, learner, sizes: dict, seed: int, dtype: str, device: str):
    """(the judge's model, the same checkpoint loaded in the worker)."""
    local = checkpoint_model(sizes, seed, dtype, device)
    try:
        remote = learner.build(checkpoint_model, sizes, seed, dtype, device)
    except LearnerRaised as exc:
        raise LabCheckFailed(f"the course's checkpoint did not load in the grading worker: {exc}") from None
    return local, remote


def phase_rows(kv, learner, local, remote, plan: dict, seed: int, source: str) -> list[dict]:
    """Prefill and decode of your generate at every (batch, prompt length) cell of the plan, timed by the judge."""
    cfg: LlamaConfig = local.cfg
    rows = []
    for batch, length in plan["cells"]:
        what = (f"seed {seed}, {cfg.layers} layers, {cfg.heads} heads sharing {cfg.kv_heads} KV heads, "
                f"{str(local.dtype).removeprefix('torch.')} on {source}: a batch of {batch} prompt(s) of {length} "
                "tokens")
        prompts = prompt_batches(cfg.vocab, batch, length, seed=seed - 1)(0)[0]
        try:
            got = GenerateCall(kv.generate, remote, plan["new"])(prompts)  # a direct call: its failures teach
        except LearnerRaised as exc:
            raise LabCheckFailed(f"{what}: generate(model, prompts, {plan['new']}) raised {exc}. A batch is a list "
                                 "of B equal-length prompts: prefill their (B, T) ids in one pass, then decode B "
                                 "tokens a step; return B lists of tokens") from None
        problem = greedy_mismatch(local, prompts, got, plan["new"], plan["tol"])
        if problem:
            raise LabCheckFailed(f"{what}, {plan['new']} new tokens: {problem}. Serve a batch as B sequences in "
                                 "step: each its own prompt, its own cache rows")
        times = {}
        for n in (1, plan["new"]):
            def check(out, args, n=n):
                problem = greedy_mismatch(local, args[0], out, n, plan["tol"])
                if problem:
                    raise LabCheckFailed(f"{what}, {n} new token(s): a timed call: {problem}. Serve a batch "
                                         "as B sequences in step: each its own prompt, its own cache rows")
            call = learner.build(GenerateCall, kv.generate, remote, n)
            spec = in_worker(prompt_batches, cfg.vocab, batch, length, seed=seed + 7919 * batch + length)
            times[n] = timed(call, spec, check=check, label=f"generate, {what}, {n} new", calls=4,
                             budget_s=plan["budget_s"]).seconds
        context = length + plan["new"] // 2
        rows.append({"batch": batch, "prompt": length, "what": what, "prefill_s": times[1],
                     "decode_s": (times[plan["new"]] - times[1]) / (plan["new"] - 1), "context": context})
    return rows


def record_rows(rows, record, cfg, dtype, source: str, ceilings=None):
    tflops = copy_gbps = None
    if ceilings is not None:
        tflops = ceilings.matmul_tflops.get("bfloat16") or max(ceilings.matmul_tflops.values())
        copy_gbps = ceilings.copy_gbps
    for row in rows:
        tag = f"b{row['batch']} p{row['prompt']}" + (" (CPU stand-in)" if source == "cpu-stand-in" else "")
        record(f"prefill {tag}", row["prefill_s"] * 1e3, unit="ms", seconds=row["prefill_s"], source=source,
               batch=row["batch"], model=row["what"])
        roof = roofline(cfg, row["batch"], row["context"], dtype, copy_gbps=copy_gbps or 1.0, tflops=tflops or 1.0)
        record(f"decode step {tag}", row["decode_s"] * 1e3, unit="ms", seconds=max(row["decode_s"], 0.0),
               bytes=roof["bytes"], flops=roof["flops"], source=source, batch=row["batch"], model=row["what"])
        record(f"decode FLOPs per byte {tag}", roof["intensity"], unit="FLOP/B", source=source,
               label="kit.llama_serving.decode_flops / decode_bytes at the mean context")
        if ceilings is not None:
            record(f"decode floor {tag}", max(roof["memory_floor_s"], roof["compute_floor_s"]) * 1e3, unit="ms",
                   label=f"{roof['bound']}-bound by the formulas", source=source, peak_tflops=tflops,
                   copy_gbps=copy_gbps)
            if row["batch"] == max(r["batch"] for r in rows):
                crossover = roof["crossover_batch"]
                record(f"compute-bound from batch p{row['prompt']}", float(crossover or 0), unit="sequences",
                       label=(f"never at this context: the KV reads grow as fast as the FLOPs (ridge "
                              f"{roof['ridge']:.0f} FLOP/B)") if crossover is None else
                       f"the batch where decode FLOPs per byte reach the ridge point ({roof['ridge']:.0f} FLOP/B)",
                       source=source, peak_tflops=tflops, copy_gbps=copy_gbps)


@pytest.mark.check("phase-times")
def test_prefill_and_decode_timed_at_batches_and_lengths(kv, learner, seed, device, record):
    source = "device" if device == "cuda" else "cpu-stand-in"
    local, remote = serve(kv, learner, SMALL_CHECKPOINT, seed, "fp32", device)
    rows = phase_rows(kv, learner, local, remote, CPU_PLAN, seed, source)
    record_rows(rows, record, local.cfg, local.dtype, source)


@pytest.mark.check("gpu-serving")
def test_serving_a_checkpoint_on_the_device(kv, learner, seed, record, ceilings):
    local, remote = serve(kv, learner, GPU_CHECKPOINT, seed, "bf16", "cuda")
    rows = phase_rows(kv, learner, local, remote, GPU_PLAN, seed, "device")
    record_rows(rows, record, local.cfg, local.dtype, "device", ceilings)
    # memory: the largest batch and prompt once more, the cache kept alive across the readings
    (batch, length), new = max(GPU_PLAN["cells"]), GPU_PLAN["new"]
    prompts = prompt_batches(local.cfg.vocab, batch, length, seed=seed + 1)(0)[0]
    what = f"seed {seed}: a batch of {batch} prompts of {length} tokens, {new} new, bf16 on the device"
    before = learner.build(llama_serving.reset_device_peak)
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    out = kv.generate(remote, prompts.tolist(), new)
    figures = learner.build(llama_serving.device_peak)
    free_after, _ = torch.cuda.mem_get_info()
    tokens = out[0] if isinstance(out, tuple) and out else out
    problem = greedy_mismatch(local, prompts, tokens, new, GPU_PLAN["tol"])
    if problem:
        raise LabCheckFailed(f"{what}: {problem}")
    if not (isinstance(figures, dict) and all(isinstance(figures.get(k), int) for k in ("max_allocated", "allocated"))):
        raise LabCheckFailed(f"{what}: the device's allocator figures did not come back ({str(figures)[:100]})")
    kv_formula = batch * (length + new - 1) * local.cfg.kv_bytes_per_token(local.dtype)
    weights = weight_bytes(local)
    record("device memory peak", figures["max_allocated"], unit="B", source="device",
           label="torch.cuda.max_memory_allocated of the serving process over the call", batch=batch)
    record("device memory held by the cache", figures["allocated"] - before, unit="B", source="device", batch=batch)
    record("KV bytes (formula, bf16)", kv_formula, unit="B", batch=batch,
           label="2 x layers x KV heads x head_dim x tokens x 2 bytes x batch")
    record("weight bytes", weights, unit="B", source="device")
    check_device_memory(before=before, held=figures["allocated"], peak=figures["max_allocated"],
                        device_delta=free_before - free_after, kv_formula=kv_formula, weights=weights,
                        source="device", what=what)
    del out
