"""Week 23: the device-memory estimate (check kind estimate). The learner's formulas are checked on several
configs and dtypes against the course's formula, then against the bytes the judge counts from real tensors on
the CPU (kit.porting.measured_bytes); on an MLU, against the device's peak allocation (blocked here)."""
from __future__ import annotations

import pytest

from infracourse.grader import CallRecord, LabCheckFailed, check_formula, check_measured
from infracourse.kit.porting import CONFIG, measured_bytes
from track_cambricon_judging import BATCH, learner_module

CASES = [  # model configs (kit.porting.CONFIG's keys), with a batch and bytes per element
    dict(CONFIG, batch=BATCH, dtype_bytes=4),
    dict(CONFIG, batch=5, dtype_bytes=2),
    dict(CONFIG, n_layer=3, n_kv_head=2, d_model=96, n_head=6, seq_len=32, vocab_size=100, mlp_ratio=2, batch=3,
         dtype_bytes=2),
    dict(CONFIG, n_layer=1, n_kv_head=1, d_model=32, n_head=4, seq_len=16, vocab_size=512, mlp_ratio=4, batch=7,
         dtype_bytes=4),
]
DTYPE = {4: "float32", 2: "bfloat16"}


def _kv_dim(c) -> int:
    return c["d_model"] // c["n_head"] * (c["n_kv_head"] or c["n_head"])


def reference_weight_bytes(**c) -> int:
    d, kv = c["d_model"], _kv_dim(c)
    block = 2 * d + d * (d + 2 * kv) + d * d + 2 * c["mlp_ratio"] * d * d
    return c["dtype_bytes"] * ((c["vocab_size"] + c["seq_len"]) * d + c["n_layer"] * block + d)


def reference_kv_cache_bytes(**c) -> int:
    return c["dtype_bytes"] * 2 * c["n_layer"] * c["batch"] * c["seq_len"] * _kv_dim(c)


def reference_activation_bytes(**c) -> int:
    d, bt = c["d_model"], c["batch"] * c["seq_len"]
    block = bt * (4 * d + d + 2 * _kv_dim(c) + c["mlp_ratio"] * d)
    return c["dtype_bytes"] * (bt * d + c["seq_len"] * d + c["n_layer"] * block + bt * d + bt * c["vocab_size"])


def _model(case: dict) -> dict:
    return {k: case[k] for k in CONFIG}


def _require_formula(fn, name: str, case: dict) -> None:
    """An estimate comes before the measurement: computed from the configuration, it dispatches no torch op."""
    ops = CallRecord.from_evidence(fn.call((), case, watch={"poison": False}).record).ops
    if ops:
        raise LabCheckFailed(f"estimates.{name} ran torch ops ({sorted(set(ops))[:6]}): it built or ran a model to "
                             "count bytes, which is a measurement. Write the formula from the configuration's numbers")


@pytest.mark.check("device-memory-estimate")
def test_device_memory_estimate(learner, record):
    est = learner_module(learner, "estimates")
    no_batch = [{k: v for k, v in c.items() if k != "batch"} for c in CASES]
    _require_formula(est.weight_bytes, "weight_bytes", no_batch[0])
    _require_formula(est.kv_cache_bytes, "kv_cache_bytes", CASES[0])
    _require_formula(est.activation_bytes, "activation_bytes", CASES[0])
    check_formula("weight_bytes", est.weight_bytes, reference_weight_bytes, no_batch)
    check_formula("kv_cache_bytes", est.kv_cache_bytes, reference_kv_cache_bytes, CASES)
    check_formula("activation_bytes", est.activation_bytes, reference_activation_bytes, CASES)
    for case in CASES[:3]:  # then against the bytes counted from the model's own tensors
        counted = measured_bytes(_model(case), case["batch"], DTYPE[case["dtype_bytes"]])
        check_measured("weight_bytes", est.weight_bytes(**{k: v for k, v in case.items() if k != "batch"}),
                       counted["weights"], 1.0001)
        check_measured("kv_cache_bytes", est.kv_cache_bytes(**case), counted["kv_cache"], 1.0001)
        check_measured("activation_bytes", est.activation_bytes(**case), counted["activations"], 1.0001)
    project = measured_bytes({}, BATCH, "float32")
    record("weight bytes", project["weights"], unit="B")
    record("kv cache bytes", project["kv_cache"], unit="B")
    record("activation bytes", project["activations"], unit="B")


@pytest.mark.check("mlu-memory")
def test_mlu_memory(learner, record):
    """Unverified here (no MLU): torch_mlu's allocator statistics around one forward pass of the project's model."""
    import torch
    import torch_mlu  # noqa: F401  (registers torch.mlu)

    from infracourse.kit.porting import build

    est = learner_module(learner, "estimates")
    model, ids = build({}, 0, BATCH)
    model, ids = model.to("mlu"), ids.to("mlu")
    torch.mlu.synchronize()
    torch.mlu.reset_peak_memory_stats()
    with torch.no_grad():
        model(ids)
    torch.mlu.synchronize()
    peak = torch.mlu.max_memory_allocated()
    kwargs = dict(CONFIG, batch=BATCH, dtype_bytes=4)
    estimate = (est.weight_bytes(**{k: v for k, v in kwargs.items() if k != "batch"}) + est.kv_cache_bytes(**kwargs)
                + est.activation_bytes(**kwargs))
    record("mlu peak bytes", peak, target=estimate, unit="B")
    check_measured("device bytes (weights + KV + activations)", estimate, peak, 1.5)
