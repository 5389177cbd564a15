"""Each drill estimate's formula (curriculum/drills) against a computation that does not share it: tensor
nbytes on the meta device, parameters of real modules, the state a real optimizer keeps, the course's ZeRO
accounting (kit.sharding), a ring all-reduce simulated chunk by chunk, a roofline from the two roofs, event
loops (a token bucket, a launch queue, paged blocks), numpy's nearest-rank percentile, the itemised
activation list of the paper the formula comes from, and the definitions of 003 §9.

Every numeric question must have an entry in INDEPENDENT: `infracourse dev check` reads this file's keys
(drills.audit.unchecked) and refuses an estimate without one."""
from __future__ import annotations

import heapq
import math
from datetime import timedelta

import numpy as np
import pytest
import torch
from torch import nn

from infracourse.course import Course


def _week13_judge():
    """graders/week13/week13_judging.py, the judge's ZeRO memory formula (never in the learner's kit)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "graders" / "week13" / "week13_judging.py"
    spec = importlib.util.spec_from_file_location("week13_judging", path)
    judge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(judge)
    return judge


_JUDGE = _week13_judge()
memory_per_device, largest_model_that_fits = _JUDGE.memory_per_device, _JUDGE.largest_model_that_fits
from infracourse.drills import audit, content, engine, measured

SEEDS = range(8)
DTYPES = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}
NAMED = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
         "int8": torch.int8, "fp8": torch.float8_e4m3fn}


def _meta_bytes(*shape, bpe) -> int:
    if bpe == 0.5:  # int4: two values a byte
        return torch.empty(math.prod(shape) // 2, dtype=torch.uint8, device="meta").nbytes
    return torch.empty(*shape, dtype=DTYPES[int(bpe)], device="meta").nbytes


def _kv_cache(v):
    k = torch.empty(int(v["layers"]), int(v["batch"]), int(v["kv_heads"]), int(v["ctx"]), int(v["head_dim"]),
                    dtype=torch.bfloat16 if v["bpe"] == 2 else torch.float8_e4m3fn, device="meta")
    return 2 * k.nbytes  # a K and a V tensor per layer


def _ring_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Simulate reduce-scatter then all-gather on a ring: every step each rank sends one chunk; the step
    lasts alpha plus the chunk's time on the link."""
    chunks = [nbytes / p] * p
    seconds, steps = 0.0, 0
    for _phase in ("reduce-scatter", "all-gather"):
        for step in range(p - 1):
            sent = max(chunks[(rank - step) % p] for rank in range(p))
            seconds += alpha + sent / beta
            steps += 1
    assert steps == 2 * (p - 1)
    return seconds


def _mlp(v):
    d, mult = int(v["d"]), int(v["mult"])
    block = nn.Sequential(nn.Linear(d, mult * d), nn.Linear(mult * d, d)).to("meta")
    return sum(p.numel() for p in block.parameters())


def _roof(flops, nbytes, peak, bw):
    return max(flops / peak, nbytes / bw)



def _meta(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*(int(n) for n in shape), dtype=dtype, device="meta")


def _optimizer_bytes_per_param(make, *, grads: bool = True) -> float:
    """Bytes per parameter after a real fp32 optimizer step: weights, gradients (unless `grads` is False: a
    checkpoint) and every state tensor, as the model's and the optimizer's state_dict hold them."""
    model = nn.Linear(8, 4)
    opt = make(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    held = sum(t.nbytes for t in model.state_dict().values())
    held += sum(p.grad.nbytes for p in model.parameters()) if grads else 0
    held += sum(t.nbytes for state in opt.state_dict()["state"].values() for t in state.values()
                if torch.is_tensor(t) and t.dim() > 0)  # Adam's step counter is a 0-d tensor: not per parameter
    return held / sum(p.numel() for p in model.parameters())


def _amdahl(share_pct: float, speedup: float, total_ms: float = 1000.0) -> float:
    """A step of total_ms, timed again after its share runs `speedup` times faster (inf: takes no time)."""
    untouched = total_ms * (1 - share_pct / 100)
    sped_up = total_ms * share_pct / 100 / speedup
    return total_ms / (untouched + sped_up)


def _launch_queue_ms(calls: int, launch_us: float, kernel_us: float) -> float:
    """The CPU issues launches back to back; the GPU runs each kernel once launched and free."""
    cpu = gpu_free = 0.0
    for _ in range(calls):
        cpu += launch_us
        gpu_free = max(cpu, gpu_free) + kernel_us
    return max(cpu, gpu_free) / 1000


def _paged_blocks(lengths, block: int) -> int:
    blocks = 0
    for length in lengths:
        used = 0  # slots filled in the sequence's last block
        for _token in range(int(length)):
            if used == 0:
                blocks += 1
            used = (used + 1) % int(block)
    return blocks


def _padding_useful_pct(b: int, mean_len: float, max_len: int) -> float:
    total = int(round(b * mean_len))
    rest, extra = divmod(total - max_len, b - 1)
    lengths = torch.tensor([max_len] + [rest + (i < extra) for i in range(b - 1)])
    mask = torch.arange(max_len)[None, :] < lengths[:, None]
    return 100 * mask.sum().item() / mask.numel()


def _served_per_second(slots: int, latency_ms: float, per_slot: int = 200) -> float:
    """A closed loop: each slot takes the next request the moment its last one finishes (an event queue in
    integer microseconds); completions counted over the window in which every slot finishes per_slot."""
    latency_us = round(latency_ms * 1000)
    events = [(latency_us, slot) for slot in range(slots)]
    window_us, done = per_slot * latency_us, 0
    while events and events[0][0] <= window_us:
        finished, slot = heapq.heappop(events)
        done += 1
        heapq.heappush(events, (finished + latency_us, slot))
    return done / (window_us / 1e6)


def _token_bucket_refused(burst: int, n: int) -> int:
    tokens, refused = burst, 0
    for _request in range(n):  # all at t = 0: nothing refills in between
        if tokens >= 1:
            tokens -= 1
        else:
            refused += 1
    return refused


def _smallest(n_ok) -> int:
    n = 1
    while not n_ok(n):
        n += 1
    return n


def _activation_bytes(s, b, h, a) -> float:
    """Korthikanti et al. 2022 (Reducing Activation Recomputation), table of what one layer keeps, bf16:
    attention: QKV input 2sbh, Q and K 4sbh, softmax output 2as^2b, its dropout mask as^2b, dropout output
    2as^2b, V 2sbh, projection input 2sbh, its dropout mask sbh; MLP: input 2sbh, first linear's output 8sbh,
    GeLU output 8sbh, dropout mask sbh; two layer norms 2sbh each."""
    sbh, as2b = s * b * h, a * s * s * b
    attention = [2 * sbh, 4 * sbh, 2 * as2b, as2b, 2 * as2b, 2 * sbh, 2 * sbh, sbh]
    mlp = [2 * sbh, 8 * sbh, 8 * sbh, sbh]
    norms = [2 * sbh, 2 * sbh]
    return sum(attention + mlp + norms)


def _ring_bytes_per_rank(nbytes: float, p: int) -> float:
    """What one rank puts on its link in a ring all-reduce: one chunk per step, 2 (p - 1) steps."""
    return sum(nbytes / p for _phase in range(2) for _step in range(p - 1))


def _fit_beta_gbs(n1: float, t1_us: float, n2: float, t2_us: float) -> float:
    """beta of t = alpha + n / beta from two points, as a least-squares solve."""
    a = torch.tensor([[1.0, n1], [1.0, n2]], dtype=torch.float64)
    alpha, inverse_beta = torch.linalg.solve(a, torch.tensor([t1_us * 1e-6, t2_us * 1e-6], dtype=torch.float64))
    return 1 / inverse_beta.item() / 1e9


def _bisect(f, target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target, f increasing."""
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2

INDEPENDENT = {
    "tensor-nbytes": lambda v: _meta_bytes(int(v["a"]), int(v["b"]), int(v["c"]), bpe=v["bpe"]),
    "mem-inference": lambda v: _meta_bytes(int(v["params_b"] * 1e9), bpe=v["bpe"]),
    "mlp-params": _mlp,
    "kv-cache-bytes": _kv_cache,
    "kv-per-token": lambda v: _kv_cache({**v, "batch": 1, "ctx": 1, "bpe": 2}),
    "zero-per-device": lambda v: memory_per_device(int(v["params_b"] * 1e9), int(v["world"]), int(v["stage"]),
                                                   "bf16-mixed")["total"],
    "mem-training-mixed": lambda v: memory_per_device(int(v["params_b"] * 1e9), 1, 0, "bf16-mixed")["total"],
    "st-memory": lambda v: memory_per_device(int(v["params_m"] * 1e6), 1, 0, "fp32")["total"],
    "ring-allreduce-time": lambda v: 1e3 * _ring_allreduce_seconds(v["mib"] * 2 ** 20, int(v["p"]),
                                                                   v["alpha_us"] * 1e-6, v["beta"] * 1e9),
    "hierarchical-allreduce-time": lambda v: 1e3 * (
        _ring_allreduce_seconds(v["mib"] * 2 ** 20, int(v["g"]), v["a_in"] * 1e-6, v["b_in"] * 1e9)
        + _ring_allreduce_seconds(v["mib"] * 2 ** 20 / v["g"], int(v["nodes"]), v["a_out"] * 1e-6, v["b_out"] * 1e9)),
    "gemm-intensity": lambda v: (2 * v["m"] * v["n"] * v["k"]) / (
        _meta_bytes(int(v["m"]), int(v["k"]), bpe=v["bpe"]) + _meta_bytes(int(v["k"]), int(v["n"]), bpe=v["bpe"])
        + _meta_bytes(int(v["m"]), int(v["n"]), bpe=v["bpe"])),
    "gemm-time-bound": lambda v: 1e3 * _roof(2 * v["m"] * v["n"] * v["k"],
                                             2 * (v["m"] * v["k"] + v["k"] * v["n"] + v["m"] * v["n"]),
                                             v["peak"] * 1e12, v["bw"] * 1e12),
    "roofline-attainable": lambda v: min(v["peak"] * 1e12, v["intensity"] * v["bw"] * 1e12) / 1e12,
    "ridge-point": lambda v: (v["peak"] * 1e12) / (v["bw"] * 1e12),
    "strong-scaling": lambda v: 100 * (v["t1"] / v["tn"]) / v["n"],  # speed-up over devices
    "weak-scaling": lambda v: 100 * v["t1"] / v["tn"],
    "mfu-from-tokens": lambda v: 100 * (v["ktok"] * 1e3 * 3 * (2 * v["params_b"] * 1e9)) / (v["gpus"] * v["peak"] * 1e12),
    "littles-law-concurrency": lambda v: v["rate"] * (v["latency_ms"] / 1e3),
    "goodput": lambda v: sum(1 for i in range(int(v["done"])) if i >= v["late"]) / v["duration"],
    "cost-per-request": lambda v: (v["gpus"] * v["price"]) / (v["rate"] * 3600 * (1 - v["fail"] / 100)),  # an hour's
    "cost-per-mtok": lambda v: v["price"] * (1e6 / (v["tok_s"] * v["busy"] / 100)) / 3600,
    "pipeline-bubble": lambda v: 100 * (v["p"] - 1) / (v["m"] + v["p"] - 1),
    "speculative-accept": lambda v: sum(v["a"] ** i for i in range(int(v["k"]) + 1)),
    # collectives and parallelism
    "busbw-factor": lambda v: _ring_bytes_per_rank(v["gb"] * 1e9, int(v["p"])) / (v["ms"] / 1e3) / 1e9,
    "alpha-beta-fit": lambda v: _fit_beta_gbs(v["small_kib"] * 2 ** 10, v["t1"], v["big_mib"] * 2 ** 20, v["t2"]),
    "zero-fits": lambda v: largest_model_that_fits(int((v["mem"] - v["reserve"]) * 1e9), int(v["world"]), 3,
                                                   "bf16-mixed"),
    "tp-allreduces": lambda v: sum(_meta(v["b"], v["s"], v["h"], dtype=torch.bfloat16).nbytes
                                   for _after in ("attention", "mlp")),
    "moe-tokens-per-expert": lambda v: math.ceil(v["cf"] * max(np.bincount(
        np.arange(int(v["tokens"] * v["k"])) % int(v["experts"])))),  # assignments dealt round-robin
    "moe-all-to-all": lambda v: sum(_meta(v["h"], dtype=torch.bfloat16).nbytes
                                    for i in range(int(v["tokens"] * v["k"])) if i % int(v["ep"]) != 0),  # rank 0
    "gradient-compression": lambda v: (lambda n: _meta(n).nbytes + _meta(n, dtype=torch.int32).nbytes)(
        v["params_m"] * 1e6 * v["pct"] / 100),
    "global-batch": lambda v: sum(v["micro"] for _rank in range(int(v["world"])) for _acc in range(int(v["accum"]))),
    "eplb-max-load": lambda v: (lambda t: (t.max() / t.mean()).item())(
        torch.tensor([v["a"], v["b"], v["c"], v["d"]], dtype=torch.float64)),
    "measured-step-time-world1": lambda v: _bisect(lambda t1: (t1 / v["step_ms"]) / 2, v["eff"], 0, 1e6),
    # memory
    "kv-max-tokens": lambda v: (int(v["mem"] * 1e9) - _meta_bytes(int(v["params_b"] * 1e9), bpe=2)
                                - int(v["reserve"] * 1e9)) // _meta(v["kv_kib"] * 1024, dtype=torch.uint8).nbytes,
    "int8-memory": lambda v: _meta(v["rows"], v["cols"], dtype=torch.int8).nbytes + _meta(v["rows"]).nbytes,
    "attention-scores-bytes": lambda v: _meta(v["b"], v["h"], v["s"], v["s"], dtype=NAMED[v["dtype"]]).nbytes,
    "checkpoint-size": lambda v: v["params_b"] * 1e9 * _optimizer_bytes_per_param(torch.optim.Adam, grads=False),
    "mem-training-sgd": lambda v: v["params_m"] * 1e6 * _optimizer_bytes_per_param(
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "activation-memory": lambda v: v["layers"] * _activation_bytes(v["s"], v["b"], v["h"], v["a"]),
    "prefetch-memory": lambda v: sum(v["prefetch"] * v["mb"] for _worker in range(int(v["workers"]))) / 1000,
    "stride-contiguous": lambda v: _meta(v["a"], v["b"], v["c"]).stride(0),
    "st-stride": lambda v: _meta(v["a"], v["b"]).t().stride(0),
    # kernels and rooflines
    "decode-bound": lambda v: 1e3 * _roof(2 * v["batch"] * v["params_b"] * 1e9,
                                          _meta_bytes(int(v["params_b"] * 1e9), bpe=2), math.inf, v["bw"] * 1e12),
    "vector-add-intensity": lambda v: 1024 / (3 * _meta(1024, dtype=NAMED[v["dtype"]]).nbytes),
    "add-time": lambda v: 1e6 * _roof(2 ** v["e"], 3 * _meta(2 ** v["e"]).nbytes, math.inf, v["bw"] * 1e9),
    "measured-add-time": lambda v: 1e6 * 3 * _meta(2 ** 26 + 3).nbytes / (v["gbps"] * 1e9),
    "softmax-time": lambda v: 1e6 * _roof(0, 2 * _meta(v["rows"], v["cols"]).nbytes, math.inf, v["bw"] * 1e9),
    "tile-intensity": lambda v: (2 * v["bm"] * v["bn"] * 32) / (_meta(v["bm"], 32, dtype=NAMED[v["dtype"]]).nbytes
                                                              + _meta(32, v["bn"], dtype=NAMED[v["dtype"]]).nbytes),
    "measured-gemm-share": lambda v: 100 * v["tflops"] / (2 * 4096 ** 3 / 1e12 / _roof(
        2 * 4096 ** 3, 3 * _meta(4096, 4096, dtype=torch.bfloat16).nbytes, v["peak"] * 1e12, v["copy"] * 1e9)),
    "fusion-bytes": lambda v: sum(2 * _meta(v["n_m"] * 1e6).nbytes for _op in range(int(v["k"])))
    - 2 * _meta(v["n_m"] * 1e6).nbytes,
    "sm-warps": lambda v: sum(math.ceil(v["threads"] / 32) for _block in range(int(v["blocks"]))),
    "fusion-end-to-end": lambda v: _amdahl(v["share"], v["op_speedup"]),
    "amdahl-speedup": lambda v: _amdahl(v["share"], v["k"]),
    "amdahl-bound-project": lambda v: _amdahl(v["share"], math.inf),
    "loop-overhead": lambda v: _launch_queue_ms(int(v["calls"]), v["launch_us"], v["kernel_us"]),
    "mfu-with-attention": lambda v: 100 * v["tok_s"] * (3 * (2 * v["params_b"] * 1e9 + v["layers"] * (
        2 * v["s"] * v["h"] + 2 * v["s"] * v["h"]))) / (v["peak"] * 1e12),  # fwd QK^T and AV per token, x3
    # measurement, data, serving, capacity, cost
    "percentile-rank": lambda v: np.percentile(np.arange(1, int(v["n"]) + 1), v["p"], method="inverted_cdf"),
    "st-percentile": lambda v: 100 * (torch.arange(int(v["n"])) < v["slow"]).double().mean().item(),
    "repeats-for-error": lambda v: _smallest(lambda n: v["sd"] / math.sqrt(n) <= v["se"] * (1 + 1e-12)),
    "loader-throughput": lambda v: _smallest(lambda w: w * 1000 / v["decode_ms"] >= v["gpu_rate"] * (1 - 1e-12)),
    "transfer-time": lambda v: 1e3 * _meta(v["batch"], 3, v["side"], v["side"], dtype=torch.uint8).nbytes
    / (v["pcie"] * 1e9),
    "padding-waste": lambda v: _padding_useful_pct(int(v["b"]), v["mean_len"], int(v["max_len"])),
    "shard-count": lambda v: len({(rank, worker) for rank in range(int(v["world"]))
                                  for worker in range(int(v["workers"]))}),
    "paged-blocks": lambda v: _paged_blocks((v["l1"], v["l2"], v["l3"]), int(v["block"])),
    "prefix-saving": lambda v: (lambda alone, shared: 100 * (alone - shared) / alone)(
        sum(v["prefix"] + v["own"] for _r in range(int(v["n"]))),  # every request prefills its own copy
        v["prefix"] + sum(v["own"] for _r in range(int(v["n"])))),  # the prefix once, then each own part
    "ttft-tpot": lambda v: (v["ttft"] + sum(v["tpot"] for _token in range(1, int(v["out"])))) / 1000,
    "littles-law-throughput": lambda v: _served_per_second(int(v["slots"]), v["latency_ms"]),
    "token-bucket": lambda v: _token_bucket_refused(int(v["burst"]), int(v["n"])),
    "capacity-at-slo": lambda v: max(load for load, p99, fail in (
        (v["l1"], v["p1"], 0), (v["l2"], v["p2"], 0.1), (v["l3"], v["p3"], 2)) if p99 < v["slo"] and fail < 1),
    "replicas-needed": lambda v: _smallest(lambda r: (r - 1) * v["cap"] >= v["peak"]),  # one can fail
    "availability-downtime": lambda v: (1 - v["nines"] / 100) * timedelta(days=30).total_seconds() / 60,
    "measured-cost-per-mtok": lambda v: v["price"] * (1e6 / v["tok_s"]) / timedelta(hours=1).total_seconds(),
    "measured-samples-epoch": lambda v: sum(1 / v["rate"] for _sample in range(int(v["n_k"] * 1000))) / 60,
}
# computations that model a little more than the question's formula, with the share that can add
TOLERANCE = {"loop-overhead": 0.01}  # the simulated queue adds the last kernel's tail after the last launch
# every estimate kind 003 §9 lists has at least one question checked here
NINE = {"memory-inference", "memory-training", "memory-zero", "kv-cache", "intensity", "roofline", "allreduce-ring",
        "allreduce-hierarchical", "scaling", "mfu", "capacity", "cost"}


@pytest.fixture(scope="module")
def questions():
    root = Course().root
    return {q.id: q for q in content.load(root) + content.load(root, selftest=True)}


@pytest.mark.parametrize("qid", sorted(INDEPENDENT))
def test_formula_matches_an_independent_computation(questions, qid):
    q = questions[qid]
    for seed in SEEDS:
        inst = engine.instantiate(q, seed, measured.examples(q) if q.kind == "measured" else None)
        want = float(INDEPENDENT[qid](inst.values))
        assert math.isclose(inst.expected, want, rel_tol=TOLERANCE.get(qid, 1e-9)), \
            (qid, seed, inst.values, inst.expected, want)


def test_every_section_9_estimate_is_checked(questions):
    checked = {questions[q].estimate for q in INDEPENDENT}
    assert NINE <= checked, f"no independent check for {sorted(NINE - checked)}"
    generated = {q.estimate for q in questions.values() if q.numeric and q.params}
    assert NINE <= generated, f"no parameter generator for {sorted(NINE - generated)}"


def test_dev_check_refuses_an_estimate_without_an_independent_check(questions, tmp_path):
    """The audit reads INDEPENDENT from this very file: every numeric question is in it, and a file that
    lacks one of them is reported by id, naming the file to edit."""
    assert audit.independent_ids(Course().root / audit.INDEPENDENT_TESTS) == set(INDEPENDENT)
    numeric = [q for q in questions.values() if q.numeric]
    assert audit.unchecked(Course().root, numeric) == []
    partial = tmp_path / audit.INDEPENDENT_TESTS
    partial.parent.mkdir()
    partial.write_text('INDEPENDENT = {"kv-cache-bytes": None}\n')
    found = audit.unchecked(tmp_path, [questions["kv-cache-bytes"], questions["busbw-factor"]])
    assert len(found) == 1 and "busbw-factor" in found[0] and str(partial) in found[0], found
    assert audit.unchecked(tmp_path / "elsewhere", numeric) == []  # an installed course ships no tests


def test_mfu_questions_stay_physical(questions):
    """An MFU over 100 % is no estimate anyone should practise: every draw stays below the peak."""
    for q in questions.values():
        if q.estimate == "mfu":
            for seed in range(64):
                inst = engine.instantiate(q, seed, measured.examples(q) if q.kind == "measured" else None)
                assert 0 < inst.expected < 100, (q.id, seed, inst.values)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the allocator's own count")
@pytest.mark.parametrize("qid", ["mem-training-mixed", "mem-inference"])
def test_memory_formulas_match_what_the_gpu_allocates(questions, qid):
    """The issue's "memory against torch.cuda.max_memory_allocated on the GPU once": a real model's bytes as
    the CUDA caching allocator counts them, held after a real step, against the question's formula at that
    parameter count (the formula's own text, evaluated by the engine). Two model sizes, and the difference of
    their bytes, after a warm-up step: what the allocator holds once whatever the model (cuBLAS's workspace, 64
    MiB on an H100) cancels, what scales with the parameters must be the formula's."""
    from infracourse.drills import formula

    def held(layers: int) -> tuple[int, int]:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model = nn.Sequential(*(nn.Linear(4096, 4096, bias=False) for _ in range(layers))).to("cuda", torch.bfloat16)
        n = sum(p.numel() for p in model.parameters())
        if qid == "mem-inference":
            return n, torch.cuda.max_memory_allocated() - base
        # bf16 weights and gradients, fp32 master weights and Adam's two moments (the question's recipe)
        master = [p.detach().float().requires_grad_() for p in model.parameters()]
        opt = torch.optim.Adam(master, lr=1e-4)
        model(torch.ones(8, 4096, device="cuda", dtype=torch.bfloat16)).sum().backward()
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()
        opt.step()
        for m, p in zip(master, model.parameters()):
            m.grad = None  # the fp32 copy of a gradient lives only for the step
            p.data.copy_(m.data)
        torch.cuda.synchronize()
        return n, torch.cuda.memory_allocated() - base

    def want(n: int) -> float:
        return formula.evaluate(questions[qid].answer, {"params_b": n / 1e9, **({"bpe": 2} if qid == "mem-inference"
                                                                               else {})})

    held(1)  # the first step allocates what stays for good (cuBLAS's workspace): before either measured size
    (n4, h4), (n8, h8) = held(4), held(8)
    per_param, expected = (h8 - h4) / (n8 - n4), (want(n8) - want(n4)) / (n8 - n4)
    assert math.isclose(per_param, expected, rel_tol=0.01), (qid, n4, h4, n8, h8, per_param, expected)
