"""Week 6 traces: the learner's profiles of train_step at two sequence lengths and two precisions, delivered
as chrome-trace files (torch.profiler export_chrome_trace), parsed here and held against a profile the judge
takes itself of the same step at one configuration drawn from the seed.

From each trace the judge re-derives: the sequence length (from the recorded input shapes of aten::linear),
the dtype the matrix products ran in, the count of each op that shapes a step (linear layers, matrix
products, host reads, concatenations), and the step's span. The files are untrusted data: size-capped,
decompressed with a cap, parsed as JSON only."""
import dataclasses
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from infracourse.grader import LabCheckFailed, in_worker
from infracourse.kit import probes_step
from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch

LENGTHS, PRECISIONS = (32, 128), ("fp32", "bf16")
BATCH = 8
COUNTED = ("aten::linear", "aten::mm", "aten::_local_scalar_dense", "aten::cat")
MAX_BYTES = 64 * 2**20  # a trace of one step of this model is well under 10 MB unpacked
REGENERATE = "run `python profile_traces.py` again (after your last change to step.py) and keep its traces/ folder"


def trace_name(seq_len: int, precision: str) -> str:
    return f"traces/step-T{seq_len}-{precision}.json.gz"


def config(seq_len: int) -> GPTConfig:
    return dataclasses.replace(GPTConfig(d_model=128, n_layer=2), seq_len=seq_len)


def read_trace(path: Path, what: str) -> list[dict]:
    if not path.is_file():
        raise LabCheckFailed(f"{what} is missing: {REGENERATE}")
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise LabCheckFailed(f"{what} is not a gzip file ({exc}): export it with "
                             "prof.export_chrome_trace('....json.gz')") from None
    if len(raw) > MAX_BYTES:
        raise LabCheckFailed(f"{what} unpacks to more than {MAX_BYTES >> 20} MiB: profile one step only")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise LabCheckFailed(f"{what} is not JSON ({str(exc)[:100]}): {REGENERATE}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise LabCheckFailed(f"{what} has no traceEvents list: write it with prof.export_chrome_trace")
    return [e for e in events if isinstance(e, dict)]


def figures(events: list[dict]) -> dict:
    """What a trace says about the step it recorded."""
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and isinstance(e.get("name"), str)]
    counts = Counter(e["name"] for e in ops)
    lengths, dtypes = Counter(), set()
    for e in ops:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        dims, types = args.get("Input Dims"), args.get("Input type")
        if e["name"] == "aten::linear" and isinstance(dims, list) and dims and isinstance(dims[0], list) \
                and len(dims[0]) == 3 and all(type(d) is int for d in dims[0]):
            lengths[dims[0][1]] += 1
        if e["name"] == "aten::mm" and isinstance(types, list):
            dtypes.update(t for t in types if isinstance(t, str) and t)
    stamps = [(e.get("ts"), e.get("dur")) for e in ops]
    stamps = [(t, d) for t, d in stamps if isinstance(t, (int, float)) and isinstance(d, (int, float))]
    span_us = max(t + d for t, d in stamps) - min(t for t, _ in stamps) if stamps else 0.0
    return {"counts": {name: counts.get(name, 0) for name in COUNTED},
            "seq_len": lengths.most_common(1)[0][0] if lengths else None,
            "bf16": "c10::BFloat16" in dtypes, "fp32": "float" in dtypes, "span_ms": span_us / 1e3}


def _judge_trace(learner, step, seq_len: int, precision: str, seed: int) -> dict:
    """The judge's own profile of the learner's step at one configuration, exported in the worker."""
    cfg = config(seq_len)
    model = GPT(cfg)
    spec = in_worker(probes_step.TrainSteps, step, in_worker(GPTConfig, **dataclasses.asdict(cfg)),
                     {k: v.detach() for k, v in model.state_dict().items()}, "cpu")
    steps = learner.worker.build(spec)
    inputs, targets = synthetic_batch(cfg, BATCH, seed=seed)
    steps.step(inputs, targets)  # warm-up, as the handout's traces do
    folder = learner.worker.scratch / "judge-traces"
    folder.mkdir(exist_ok=True)
    path = folder / f"T{seq_len}-{precision}.json.gz"
    steps.trace(inputs, targets, precision, str(path))
    return figures(read_trace(path, "the judge's own trace"))


@pytest.mark.check("profile-traces")
def test_traces(learner, seed, record):
    step = learner.module("step").train_step
    seen = {}
    for seq_len in LENGTHS:
        for precision in PRECISIONS:
            name = trace_name(seq_len, precision)
            got = seen[seq_len, precision] = figures(read_trace(learner.path(name), name))
            if got["seq_len"] != seq_len:
                raise LabCheckFailed(f"{name}: its linear layers ran on sequences of {got['seq_len']} tokens, not "
                                     f"{seq_len} (profile with record_shapes=True, on GPTConfig(d_model=128, "
                                     f"n_layer=2) with seq_len={seq_len}); {REGENERATE}")
            if got["bf16"] != (precision == "bf16") or (precision == "fp32" and not got["fp32"]):
                ran = "bf16" if got["bf16"] else "fp32" if got["fp32"] else "no recorded dtype"
                raise LabCheckFailed(f"{name}: its matrix products ran in {ran}, not {precision} (bf16: run the "
                                     f"step under torch.autocast(device, torch.bfloat16)); {REGENERATE}")
            record(f"step span T={seq_len} {precision}", got["span_ms"], unit="ms")
    # one configuration, drawn from the seed, profiled by the judge and compared op by op
    seq_len, precision = LENGTHS[seed % 2], PRECISIONS[(seed // 2) % 2]
    mine, judge = seen[seq_len, precision], _judge_trace(learner, step, seq_len, precision, seed)
    if mine["counts"] != judge["counts"] or mine["seq_len"] != judge["seq_len"] or mine["bf16"] != judge["bf16"]:
        differ = {op: (mine["counts"][op], judge["counts"][op]) for op in COUNTED
                  if mine["counts"][op] != judge["counts"][op]}
        raise LabCheckFailed(
            f"{trace_name(seq_len, precision)} does not record one step of your current train_step: op counts "
            f"(yours, the judge's profile of it) {differ or 'equal'}, sequence length {mine['seq_len']} / "
            f"{judge['seq_len']}; {REGENERATE}")
