"""Your int8 Linear serving a checkpoint: the course writes a Llama-style checkpoint in the worker, loads it, and
swaps your Int8Linear(linear) into every projection of every layer (kit.quant_serving.quantized_llama); the
same checkpoint in full precision is served beside it on the same load matrix (kit.load_matrix: the same cells,
the same seeds, so the same prompts and arrivals).

Serving: the course's StepServer holds each model in the worker, one request at a time, one step per call; the
judge's StepEngine drives it from kit.loadgen (run_matrix) and stamps every token on the judge's clock as its
call returns. Every cell must run, every request finish with the cell's token count and greedy tokens of its
model (the int8 ones the course's int8 model's), the closed loop keep its users in flight, and the figures
recompute from the raw records (kit.load_matrix.check_matrix). Latency is recorded, never required: the
course's int8 reference dequantises every weight on each call, so its decode may well be slower than the
full-precision model's; int8 buys memory here.

quant-serving      any machine (fp32 checkpoint): the bytes the int8 model holds once it has served are counted
                   by the judge from the tensors it keeps alive (parameters, buffers and tensors in plain
                   attributes, fetched: not its state_dict's word, and a copy cached by a call counts); its layer
                   Linears at least lab.yaml's factor smaller than fp32; on a CPU the figures labelled a stand-in.
gpu-quant-serving  needs cuda: the 1.0 B-parameter checkpoint in bf16 on the device; the int8 model's device
                   memory is what the device's allocator gave it (torch.cuda.memory_allocated in the serving
                   process, with the judge's reading of the device beside it), against the bf16 model's; each
                   cell's memory is the weights plus the most the allocator held above them during its requests.
"""
import pytest
import torch

from infracourse.grader import LabCheckFailed, LearnerRaised
from infracourse.kit import llama_serving
from infracourse.kit.llama import checkpoint_model
from infracourse.kit.llama_serving import greedy_mismatch, weight_bytes
from infracourse.kit.load_matrix import LoadCell, check_matrix, load_matrix, load_problems, run_cell, run_matrix
from infracourse.kit.loadgen import read_records, request_matrix
from infracourse.kit.quant_serving import (StepEngine, StepServer, held_bytes, held_tensors, layer_linears,
                                           quantized_llama, reference_int8_llama)
from week18_judging import learner_quant, require

SMALL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "intermediate": 256,
         "max_positions": 128}
GPU = {"layers": 8, "hidden": 3072, "heads": 24, "kv_heads": 8, "vocab": 32000, "intermediate": 8192,
       "max_positions": 2048}
# 2 prompt lengths x 2 output lengths x closed loops of 1 and 4 users: the 4 users queue in front of a server
# of one request at a time, so their TTFT shows the wait. On the GPU 4 requests a cell: a batch-1 decode step of
# the 1.0 B model takes 8-18 ms on an H100 (launch-bound), 8 s a model for this matrix
CPU_MATRIX = load_matrix(input_lens=[16, 48], output_lens=[4, 16], concurrencies=[1, 4], requests=8)
GPU_MATRIX = load_matrix(input_lens=[128, 1024], output_lens=[4, 16], concurrencies=[1, 4], requests=4)
# a greedy token's logit within this of the best: fp32; bf16, where a batch-1 decode with its KV cache and the
# judge's one forward over the whole text round differently (logits below 8, an ulp 0.03: 3 ulps seen on an H100)
CPU_TOL, GPU_TOL = 1e-3, 0.25
GPU_FACTOR = 1.8  # bf16 -> int8 + one scale per row: about 2x
# figure -> where run_matrix's metrics keep it (ms, or tok/s)
FIGURES = {"TTFT p50": ("ttft_ms", "p50"), "TTFT p99": ("ttft_ms", "p99"), "TPOT p50": ("tpot_ms", "p50"),
           "TPOT p99": ("tpot_ms", "p99"), "E2EL p50": ("e2el_ms", "p50"), "E2EL p99": ("e2el_ms", "p99")}


@pytest.fixture(scope="module")
def quant(learner):
    return learner_quant(learner)


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


def judge_held(learner, qremote, local, what):
    """(bytes the int8 model holds, its device bytes, bytes of its layer Linears by the judge's count)."""
    tensors = learner.build(held_tensors, qremote)
    require(isinstance(tensors, list) and all(isinstance(t, torch.Tensor) for t in tensors),
            f"{what}: the int8 model's tensors did not come back")
    held = held_bytes(tensors)
    full = held_bytes(held_tensors(local))["bytes"]
    linear = held_bytes(t.weight for t in layer_linears(local).values())["bytes"]
    return held, full, linear


def served_tokens(record) -> list[int] | None:
    try:
        return [int(t) for t in record.text.split()]
    except ValueError:
        return None


def check_cell(cell: LoadCell, records, seed: int, reference, vocab: int, tol: float, name: str, what: str) -> None:
    """Every request of the cell finished with its tokens, greedy under `reference`, under the cell's load."""
    where = f"{what}: the {name} model, cell {cell.name} (seed {seed})"
    for i, rec in enumerate(records):
        tokens = served_tokens(rec)
        if not rec.success:
            raise LabCheckFailed(f"{where}: request {i} failed: {rec.error}")
        require(rec.prompt_tokens == cell.input_len and rec.output_tokens == cell.output_len and tokens is not None
                and len(tokens) == cell.output_len,
                f"{where}: request {i} gave {rec.output_tokens} tokens for a {rec.prompt_tokens}-token prompt, the "
                f"cell asks {cell.output_len} for {cell.input_len}")
    specs = request_matrix([cell.input_len], [cell.output_len], cell.requests, vocab_size=vocab, seed=seed)
    prompts = torch.tensor([s.prompt_ids for s in specs])
    problem = greedy_mismatch(reference, prompts, [served_tokens(r) for r in records], cell.output_len, tol)
    if problem:
        hint = ("Int8Linear must compute with its int8 weights times their per-row scales" if name == "int8" else
                "the course's own model gave other tokens than its copy here: a course bug, please report it")
        raise LabCheckFailed(f"{where}: its tokens are not the course's {name} model's ({problem}): {hint}")
    problems = load_problems(records, cell, seed=seed)
    require(not problems, f"{where}: {'; '.join(problems)}")


def serve_matrix(learner, model, reference, cells, seed, out_dir, tol, name, what) -> tuple[dict, object]:
    """Every cell of `cells` through the worker's `model` (one request at a time), on the judge's clock; the
    records checked (check_cell) and their figures recomputed (check_matrix). Returns ({cell name: metrics}, the
    worker's StepServer)."""
    vocab = reference.cfg.vocab
    server = learner.build(StepServer, model)
    engine = StepEngine(server.prefill, server.decode)
    longest = max(c.input_len for c in cells)  # a first request pays the first calls' setup: not in the figures
    run_cell(LoadCell(longest, 2, 1, concurrency=1), seed=seed + 10_000, vocab_size=vocab, send=engine.send)
    rows = run_matrix(cells, out_dir, seed=seed, vocab_size=vocab, send=engine.send,
                      conditions={"model": name, "what": what, "server": "one request at a time (StepServer)"})
    problems = check_matrix(out_dir, cells)
    require(not problems, f"{what}: the {name} model's matrix: {'; '.join(problems[:3])}")
    for k, cell in enumerate(cells):
        records, _, _ = read_records(out_dir / f"{cell.name}.json")
        check_cell(cell, records, seed + k, reference, vocab, tol, name, what)
    return {row["file"].removesuffix(".json"): row["metrics"] for row in rows}, server


def cell_memory(server, weights: int, model, cells, device: str, name: str, what: str):
    """cell -> bytes the model serves it with: its weights plus, on CUDA, the most the allocator held above them
    during the cell's requests (the worker's StepServer.memory_peaks, by prompt and output length); on a CPU,
    which has no such allocator, one request's KV cache by its size."""
    if device != "cuda":
        kv = model.cfg.kv_bytes_per_token(model.dtype)
        return lambda c: weights + kv * (c.input_len + c.output_len)
    peaks = {(i, o): peak for i, o, peak in server.memory_peaks()}
    missing = [c.name for c in cells if not isinstance(peaks.get((c.input_len, c.output_len)), int)]
    require(not missing, f"{what}: the serving process kept no allocator peak for the {name} model's cells {missing}")
    return lambda c: weights + peaks[(c.input_len, c.output_len)]


def record_matrix(record, cells, metrics: dict, memory: dict, base: str, source: str, what: str) -> None:
    """Per cell: the int8 / full-precision E2EL P50 ratio, then each model's latencies, output tok/s and memory."""
    tag = " (CPU stand-in)" if source == "cpu-stand-in" else ""
    for cell in cells:
        ours, theirs = metrics["int8"][cell.name], metrics[base][cell.name]
        record(f"{cell.name} E2EL p50 int8/{base}{tag}", ours["e2el_ms"]["p50"] / theirs["e2el_ms"]["p50"],
               unit="x", source=source, model=what)
        for name in (base, "int8"):
            m = metrics[name][cell.name]
            for figure, (key, stat) in FIGURES.items():
                record(f"{cell.name} {name} {figure}{tag}", m[key][stat], unit="ms", source=source, model=what)
            record(f"{cell.name} {name} output tok/s{tag}", m["output_throughput"], unit="tok/s", source=source,
                   model=what)
            record(f"{cell.name} {name} memory{tag}", memory[name](cell), unit="B", source=source, model=what)


@pytest.mark.check("quant-serving")
def test_int8_checkpoint_served_on_the_matrix(quant, learner, seed, device, record, lab_check, tmp_path):
    source = "device" if device == "cuda" else "cpu-stand-in"
    local, ref, remote, qremote = served_pair(quant, learner, SMALL, seed, "fp32", device)
    what = (f"seed {seed}: a {SMALL['layers']}-layer checkpoint (hidden {SMALL['hidden']}, {SMALL['heads']} heads "
            f"sharing {SMALL['kv_heads']} KV heads), fp32 and int8, one request at a time")
    metrics, servers = {}, {}
    for name, model, reference in (("fp32", remote, local), ("int8", qremote, ref)):
        metrics[name], servers[name] = serve_matrix(learner, model, reference, CPU_MATRIX, seed, tmp_path / name,
                                                    CPU_TOL, name, what)
    held, full, linear = judge_held(learner, qremote, local, what)  # after serving: a cache built by a call counts
    rest = full - linear  # the embedding table, the norms and the LM head: kept in fp32
    factor = linear / max(held["bytes"] - rest, 1)
    record("fp32 model bytes held", full, unit="B", bytes=full)
    record("int8 model bytes held", held["bytes"], unit="B", bytes=held["bytes"],
           label="every tensor the model keeps alive after serving, counted by the judge")
    record("layer Linear memory factor", factor, target=lab_check.threshold, unit="x")
    require(factor >= lab_check.threshold,
            f"{what}: after serving, the int8 model keeps {held['bytes']} bytes of tensors alive; less the fp32 "
            f"embedding, norms and head ({rest} bytes) its layer Linears take {held['bytes'] - rest} bytes against "
            f"{linear} in fp32: {factor:.2f}x smaller, at least {lab_check.threshold:g}x expected. Counted are the "
            "tensors the model holds, wherever it holds them (a list, a dict, a kept nn.Linear, a copy made during a "
            "call), not only its state_dict: keep no fp32 copy of a weight once it is quantised")
    memory = {name: cell_memory(servers[name], weights, local, CPU_MATRIX, device, name, what)
              for name, weights in (("fp32", full), ("int8", held["bytes"]))}
    record_matrix(record, CPU_MATRIX, metrics, memory, "fp32", source, what)


@pytest.mark.check("gpu-quant-serving")
def test_int8_checkpoint_on_the_device(quant, learner, seed, record, tmp_path):
    local = checkpoint_model(GPU, seed, "bf16", "cuda")
    remote = learner.build(checkpoint_model, GPU, seed, "bf16", "cuda")
    what = f"seed {seed}: a 1.0 B-parameter checkpoint in bf16 on the device and its int8 copy, one request at a time"
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
    int8_device = after - before  # what the device's allocator gave the int8 copy
    bf16_device = weight_bytes(local)
    metrics, servers = {}, {}
    for name, model, reference in (("bf16", remote, local), ("int8", qremote, ref)):
        metrics[name], servers[name] = serve_matrix(learner, model, reference, GPU_MATRIX, seed, tmp_path / name,
                                                    GPU_TOL, name, what)
    held, full, linear = judge_held(learner, qremote, local, what)  # after serving: a cache built by a call counts
    rest = full - linear
    record("bf16 model device bytes", bf16_device, unit="B", source="device")
    record("int8 model device bytes", int8_device, unit="B", source="device",
           label="torch.cuda.memory_allocated of the serving process, taken around the int8 copy")
    factor = linear / max(held["bytes"] - rest, 1)
    record("layer Linear memory factor against bf16", factor, target=GPU_FACTOR, unit="x")
    require(factor >= GPU_FACTOR, f"{what}: after serving, the int8 layer Linears take {held['bytes'] - rest} bytes "
            f"against {linear} in bf16: {factor:.2f}x, at least {GPU_FACTOR}x expected (one byte per weight + a scale "
            "per row; a copy of a weight made during a call and kept counts too)")
    require(held["device_bytes"] >= 0.99 * held["bytes"],
            f"{what}: the int8 model holds {held['bytes'] - held['device_bytes']} bytes off the device: on a GPU the "
            "served model lives in device memory; host memory is no device figure")
    require(int8_device >= 0.99 * held["device_bytes"] and free_before - free_after >= 0.9 * int8_device - 64 * 2**20,
            f"{what}: the allocator says the int8 copy took {int8_device} bytes, the device shows "
            f"{free_before - free_after} more in use, its tensors hold {held['device_bytes']}: not the device's figures")
    memory = {name: cell_memory(servers[name], weights, local, GPU_MATRIX, "cuda", name, what)
              for name, weights in (("bf16", bf16_device), ("int8", int8_device))}
    record_matrix(record, GPU_MATRIX, metrics, memory, "bf16", "device", what)
