"""Continuous batching on the device (needs cuda): no step floor, a real model. The judge writes a Llama-layout
checkpoint (GPU_CHECKPOINT: 0.87 B parameters, bf16, vocabulary 128) into the server's working folder; the
course's ModelRunner serves it on the GPU with a pool in bf16, and a step costs what the device takes. The load
point runs through your server (engine.py and server.py as they are, started with this configuration), which is
then stopped, and through the course's static batching (kit.static_server) on the same device, checkpoint and
limits, the judge's clock around both: continuous must beat static by the threshold at no worse P99 TTFT. While
either is timed, the grade's other servers of yours are paused. Every token must come from the runner's steps
(its journal), some requests' tokens are recomputed by the judge, and the memory figures are the device's: the
pool's bytes from the CUDA allocator in your server's process against kv_pool_bytes at bf16, the peak
max_memory_allocated, and the judge's own reading of the device beside them."""
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from infracourse.grader import LabCheckFailed, WrongOutput, serving
from infracourse.kit import batching
from infracourse.kit.llama_serving import greedy_mismatch, weight_bytes
from infracourse.kit.loadgen import compute_metrics
from week17_judging import (GPU_CHECKED, GPU_NEAR_TIE, JOURNAL, LIVE_SERVERS, check_device_memory,
                            compare_with_static, gpu_config, paused, read_journal, read_memory, require_own_server,
                            teach, tokens_of, tokens_through_runner, wait_idle)


def run_server(app_dir: Path, app: str, checkpoint: Path, seed: int, who: str) -> dict:
    """Copy the checkpoint into a fresh working folder (the only one the sandbox shows the server), start `app`
    there with gpu_config, warm it up, run the load point on the judge's clock, read what the runner wrote and
    the device memory the server took (the judge's reading), and stop it."""
    scratch = Path(tempfile.mkdtemp(prefix="ic17-gpu-", dir="/tmp")).resolve()  # short: the socket stays here
    try:
        shutil.copytree(checkpoint, scratch / "checkpoint")
        cfg = gpu_config(scratch / "checkpoint")
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        with serving.serve(app_dir, app, scratch=scratch, env=cfg.to_env(), ready_timeout_s=120,
                           device="cuda") as server:
            if Path(server.uds).parent != scratch:
                raise RuntimeError(f"the server's working folder moved ({server.uds}): a course bug, please report it")
            warm = batching.bench_specs(seed + 1)[:batching.BENCH_CONCURRENCY]
            server.load(warm, concurrency=batching.BENCH_CONCURRENCY, timeout_s=60.0)  # CUDA kernels chosen, caches
            wait_idle(server, cfg.num_blocks, 10.0)
            begin = len(read_journal(scratch / JOURNAL))
            specs = batching.bench_specs(seed)
            records, duration = server.load(specs, concurrency=batching.BENCH_CONCURRENCY, timeout_s=60.0)
            server.require_alive("during the load point on the GPU")
            free_after = torch.cuda.mem_get_info()[0]
            failed = [r.error for r in records if not r.success]
            if failed and who == "static":
                raise RuntimeError(f"the course's static batching on the GPU: {len(failed)} requests failed "
                                   f"({failed[:2]}); a course bug, please report it")
            if failed:
                raise LabCheckFailed(teach(server, f"on the GPU, {len(failed)} of the load point's {len(records)} "
                                                   f"requests failed ({failed[0][:300]})"))
            return {"specs": specs, "records": records, "metrics": compute_metrics(records, duration),
                    "steps": read_journal(scratch / JOURNAL)[begin:], "memory": read_memory(scratch),
                    "device_delta": free_before - free_after, "cfg": cfg}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.check("gpu-continuous-batching")
def test_continuous_batching_on_the_device(learner, seed, gpu_checkpoint, gpu_judge_model, tmp_path_factory,
                                           lab_check, record):
    s, checkpoint, judge = seed % 10_000, gpu_checkpoint, gpu_judge_model
    what = (f"seed {s}: a {judge.cfg.layers}-layer bf16 checkpoint on the device, no step floor, the load point "
            f"({len(batching.bench_specs(s))} requests, {batching.BENCH_CONCURRENCY} in flight)")
    require_own_server(learner.root)
    with paused(LIVE_SERVERS):
        mine = run_server(learner.root, "server:app", checkpoint, s, "learner")
        static = run_server(tmp_path_factory.mktemp("static-app"), "infracourse.kit.static_server:app", checkpoint,
                            s, "static")
    cfg, m, st = mine["cfg"], mine["metrics"], static["metrics"]
    for name, value, unit in (("output tokens per s", m["output_throughput"], "tok/s"),
                              ("static output tokens per s", st["output_throughput"], "tok/s"),
                              ("ttft p99", m["ttft_ms"]["p99"], "ms"), ("static ttft p99", st["ttft_ms"]["p99"], "ms"),
                              ("tpot p50", m["tpot_ms"]["p50"], "ms"), ("static tpot p50", st["tpot_ms"]["p50"], "ms")):
        record(f"{name} (device)", value, unit=unit, source="device", model=what)
    ratio = m["output_throughput"] / st["output_throughput"]
    record("throughput ratio (device)", ratio, target=lab_check.threshold, unit="x", source="device")
    problem = tokens_through_runner(mine["steps"], mine["records"])
    if problem:
        raise WrongOutput(f"{what}: {problem}")
    for i in sorted(range(len(mine["specs"])), key=lambda i: -mine["specs"][i].max_tokens)[:GPU_CHECKED]:
        spec, tokens = mine["specs"][i], tokens_of(mine["records"][i].text)
        if len(tokens) != spec.max_tokens:
            raise WrongOutput(f"{what}, request {i}: {len(tokens)} tokens streamed, max_tokens was {spec.max_tokens}")
        wrong = greedy_mismatch(judge, torch.tensor([spec.prompt_ids]), [tokens], spec.max_tokens, GPU_NEAR_TIE)
        if wrong:
            raise WrongOutput(f"{what}, request {i} (prompt of {len(spec.prompt_ids)} tokens): {wrong}, against "
                                 "the judge's greedy tokens of the same checkpoint")
    formula = batching.kv_pool_bytes(judge.cfg, cfg.num_blocks, cfg.block_size, judge.dtype)
    memory, weights = mine["memory"] or {}, weight_bytes(judge)
    record("KV pool bytes (device)", memory.get("kv_pool_bytes") or 0, unit="B", source="device",
           label="torch.cuda.memory_allocated around the pool's allocation, in your server's process")
    record("KV pool bytes (formula, bf16)", formula, unit="B", label="2 x layers x KV heads x head_dim x slots x 2")
    record("device memory peak", memory.get("max_allocated") or 0, unit="B", source="device",
           label="torch.cuda.max_memory_allocated of your server's process over the load")
    record("device memory taken (judge)", max(mine["device_delta"], 0), unit="B", source="device",
           label="torch.cuda.mem_get_info, read by the judge before the server started and after the load")
    check_device_memory(mine["memory"], formula=formula, weights=weights, device_delta=mine["device_delta"],
                        what=what)
    problem = compare_with_static(m, st, lab_check.threshold)
    if problem:
        raise LabCheckFailed(f"{what}: {problem}")
