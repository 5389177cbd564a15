"""Week 22: the reference run. The learner's capture against the judge's own seeded run (kit.porting), and the
raw summary their run wrote against the judge's recomputation of the config it names."""
from __future__ import annotations

import math

import pytest
import torch

from infracourse.grader import LabCheckFailed, assert_close
from infracourse.kit.porting import reference_run
from track_cambricon_judging import BATCH, OTHER, learner_module, model_of, read_raw

REL = 1e-6  # the same float32 computation in another process: equal up to the summation order of a matmul


def _as_layers(got, what: str) -> dict:
    if not isinstance(got, dict) or not got or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                       for k, v in got.items()):
        raise LabCheckFailed(f"{what} returned {type(got).__name__}: return a dict {{layer name: output tensor}}")
    return got


def _same_layers(mine: dict, ours: dict, what: str) -> None:
    if list(mine) != list(ours):
        missing, extra = [n for n in ours if n not in mine], [n for n in mine if n not in ours]
        raise LabCheckFailed(
            f"{what}: the layers are not the model's leaf modules in call order. Expected {list(ours)}; "
            + (f"missing {missing}; " if missing else "") + (f"unexpected {extra}; " if extra else "")
            + ("same names in another order: keep the order the forward hooks fire in" if not missing and not extra
               else "hook every module of model.named_modules() that has no children"))


@pytest.mark.check("reference-run")
def test_reference_run(learner, seed):
    ref = learner_module(learner, "reference")
    for model, batch in (({}, BATCH), (OTHER, 3)):
        what = f"reference.capture({model}, seed={seed}, batch={batch})"
        mine = _as_layers(ref.capture(model, seed, batch), what)
        ours = reference_run(model, seed, batch)
        _same_layers(mine, ours, what)
        for name, want in ours.items():
            got = mine[name]
            if got.dtype != torch.float32:
                raise LabCheckFailed(f"{what}: layer {name} is {got.dtype}; the reference runs in float32")
            assert_close(got, want, rtol=REL, atol=REL * want.abs().max().item(),
                         what=f"{what}, layer {name} (the judge's GPT(config, seed={seed}) on synthetic_batch(seed))")
    first = _as_layers(ref.capture({}, seed, BATCH), "reference.capture")
    second = _as_layers(ref.capture({}, seed, BATCH), "reference.capture")
    if list(first) != list(second) or not all(torch.equal(first[n], second[n]) for n in first):
        raise LabCheckFailed(f"reference.capture({{}}, {seed}, {BATCH}) gave different outputs on two calls: a "
                             "reference must repeat bit for bit (seed the model and the batch, no dropout, eval mode)")


@pytest.mark.check("reference-raw-data")
def test_reference_raw_data(learner):
    data = read_raw(learner, "reference.json")
    model = model_of(data, "reference.json")
    seed, batch, layers = data.get("seed"), data.get("batch"), data.get("layers")
    if type(seed) is not int or type(batch) is not int or not 1 <= batch <= 64 or not isinstance(layers, dict):
        raise LabCheckFailed("raw/reference.json needs `seed` (int), `batch` (int, 1..64) and `layers` "
                             "({name: {shape, sum, abs_max}}) beside `model`")
    ours = reference_run(model, seed, batch)
    if list(layers) != list(ours):
        raise LabCheckFailed(f"raw/reference.json lists layers {list(layers)[:6]}...; the reference run of "
                             f"model {model}, seed {seed}, batch {batch} has {list(ours)} (in call order)")
    for name, out in ours.items():
        entry = layers[name]
        want = {"shape": list(out.shape), "sum": out.double().sum().item(), "abs_max": out.abs().max().item()}
        entry = entry if isinstance(entry, dict) else {}
        if entry.get("shape") != want["shape"]:
            raise LabCheckFailed(f"raw/reference.json, layer {name}: shape {entry.get('shape')}, the judge's run "
                                 f"has {want['shape']}")
        for key in ("sum", "abs_max"):
            value = entry.get(key)
            scale = out.abs().sum().item() if key == "sum" else want[key]
            if not isinstance(value, (int, float)) or not math.isfinite(value) or \
                    abs(value - want[key]) > 1e-5 * scale + 1e-9:
                raise LabCheckFailed(
                    f"raw/reference.json, layer {name}: {key} = {value}, but the judge's reference run of model "
                    f"{model}, seed {seed}, batch {batch} gives {want[key]:.8g}. Rerun `python run.py --out raw` "
                    "with your current reference.py and keep what it writes")
