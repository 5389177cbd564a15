"""Week 23: the measurements only an MLU can make (needs: mlu). On this course's machines they are blocked,
listed in the report's to_be_verified and never replaced by a figure. Written against torch_mlu's documented
API (torch.mlu.synchronize, the "mlu" device); unverified until a grade runs on an MLU."""
from __future__ import annotations

import statistics
import time

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.porting import build, layer_outputs, reference_run
from track_cambricon_judging import BATCH, learner_module


def _on_mlu():
    import torch
    import torch_mlu  # noqa: F401  (registers torch.mlu and the "mlu" device at PrivateUse1)

    model, ids = build({}, 0, BATCH)
    return torch, model.to("mlu"), ids.to("mlu")


@pytest.mark.check("mlu-precision")
def test_mlu_precision(learner):
    torch, model, ids = _on_mlu()
    reference = reference_run({}, 0, BATCH)
    outputs = layer_outputs(model, ids)
    device = {name: out.float().cpu() for name, out in outputs.items()}
    verdict = learner_module(learner, "harness").compare(reference, device)
    if verdict.get("first_divergent") is not None:
        raise LabCheckFailed(f"on the MLU your harness finds {verdict['first_divergent']!r} out of tolerance: "
                             "the port diverges there; see raw data and the layer's op in your call chain")


@pytest.mark.check("mlu-latency")
def test_mlu_latency(record):
    torch, model, ids = _on_mlu()
    times = []
    with torch.no_grad():
        for i in range(25):
            torch.mlu.synchronize()
            start = time.perf_counter()
            model(ids)
            torch.mlu.synchronize()
            if i >= 5:  # warm-up excluded
                times.append((time.perf_counter() - start) * 1e3)
    record("mlu forward", statistics.median(times), unit="ms")
