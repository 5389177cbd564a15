"""Week 23-24: the precision harness, exercised against kit.porting's stand-in device.

The judge makes the device runs (clean, or with layers it perturbs, seeded and unknown to the learner) and the
reference; the learner's harness.compare sees only the two dicts of tensors. Its verdicts are graded against
what the judge perturbed, its figures against the judge's own layer_metrics."""
from __future__ import annotations

import math

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.porting import KINDS, MODES, Perturbation, device_run, layer_metrics, reference_run
from track_cambricon_judging import BATCH, learner_module, model_of, read_raw

# the judge's perturbations: big against the dtype's rounding, small against a careless tolerance
FP32_NOISE, BF16_NOISE = 1e-2, 0.2  # x rms of the layer's output


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _share(reference, device) -> float:
    """A layer's max abs error as a share of its largest reference value."""
    return layer_metrics(reference, device)["max_abs"] / reference.abs().max().item()


def _verdict(harness, reference: dict, device: dict, what: str) -> dict:
    """harness.compare's result, type-checked, its figures checked against the judge's own."""
    got = harness.compare(reference, device)
    layers = got.get("layers") if isinstance(got, dict) else None
    layers = layers if isinstance(layers, list) else []
    if [entry.get("name") if isinstance(entry, dict) else None for entry in layers] != list(reference):
        raise LabCheckFailed(f"harness.compare ({what}) must return {{'layers': [one dict per layer, in the "
                             f"reference's order, each with its 'name'], 'first_divergent': name or None}}; got "
                             f"{str(got)[:200]}")
    first = got.get("first_divergent")
    if first is not None and first not in reference:
        raise LabCheckFailed(f"harness.compare ({what}): first_divergent {first!r} is not a layer of the run")
    for layer in layers:
        name = layer["name"]
        values = {k: layer.get(k) for k in ("max_abs", "max_rel", "cosine")}
        if not all(_finite(v) for v in values.values()) or not isinstance(layer.get("ok"), bool):
            raise LabCheckFailed(f"harness.compare ({what}), layer {name}: each layer needs max_abs, max_rel, "
                                 f"cosine (finite numbers) and ok (a bool); got {str(layer)[:200]}")
        ours = layer_metrics(reference[name], device[name])
        if abs(values["max_abs"] - ours["max_abs"]) > 1e-3 * ours["max_abs"] + 1e-12 or \
                abs(values["cosine"] - ours["cosine"]) > 1e-6:
            raise LabCheckFailed(
                f"harness.compare ({what}), layer {name}: max_abs {values['max_abs']:.4g} and cosine "
                f"{values['cosine']:.8f}, but the judge computes max |device - reference| = {ours['max_abs']:.4g} and "
                f"cosine {ours['cosine']:.8f} (both in float64, over the whole tensor): compute them on the full "
                "tensors after upcasting both to float64")
    return {"first": first, "flagged": [l["name"] for l in layers if not l["ok"]], "layers": layers}


@pytest.fixture(scope="module")
def harness(learner):
    return learner_module(learner, "harness")


@pytest.mark.check("harness-clean")
def test_harness_clean(harness, seed):
    reference = reference_run({}, seed, BATCH)
    for dtype, mode in (("float32", "isolated"), ("float32", "chained"), ("bfloat16", "isolated")):
        device = device_run({}, seed, BATCH, dtype=dtype, mode=mode)
        what = f"a clean {dtype} device, {mode}, seed {seed}"
        verdict = _verdict(harness, reference, device, what)
        if verdict["flagged"] or verdict["first"] is not None:
            worst = max(verdict["flagged"] or [verdict["first"]], key=lambda n: _share(reference[n], device[n]))
            ours = layer_metrics(reference[worst], device[worst])
            raise LabCheckFailed(
                f"on {what} (the same model computed with other rounding, no fault) your harness flags "
                f"{verdict['flagged'] or [verdict['first']]}. Layer {worst}: max abs error {ours['max_abs']:.3g}, "
                f"{_share(reference[worst], device[worst]):.2g} of its largest value, cosine "
                f"{ours['cosine']:.9f}. A tolerance must allow the dtype's rounding (float32: about 1e-7 of the "
                "scale, bfloat16: about 5e-3): compare against the dtype of the device tensors, relative to the "
                "layer's scale, never bit for bit")


def _require_flags(verdict: dict, perturbed: list[str], reference, device, what: str, chained: bool) -> None:
    order = list(reference)
    first = min(perturbed, key=order.index)
    if chained:  # the error flows on: only the layers before the first perturbed one must stay clean
        wrong = [n for n in verdict["flagged"] if order.index(n) < order.index(first)]
        missed = [] if first in verdict["flagged"] else [first]
    else:
        wrong = [n for n in verdict["flagged"] if n not in perturbed]
        missed = [n for n in perturbed if n not in verdict["flagged"]]
    if missed:
        figures = "; ".join(f"{n}: max abs error {m['max_abs']:.3g} ({_share(reference[n], device[n]):.2g} of its "
                            f"scale), cosine {m['cosine']:.9f}"
                            for n in missed for m in [layer_metrics(reference[n], device[n])])
        raise LabCheckFailed(
            f"on {what} the judge broke {perturbed}; your harness passed {missed} ({figures}). That is far above "
            f"the dtype's rounding but below your tolerance: a tolerance must follow the device's dtype (a fixed "
            "1e-2 or a cosine of 0.999 passes a layer computed in bfloat16), and every layer must be compared, "
            "not only the final output")
    if wrong:
        raise LabCheckFailed(f"on {what} the judge broke {perturbed} only, but your harness also flags {wrong}"
                             + (" (before the first broken layer)" if chained else
                                " (each layer here was fed the reference's inputs: an error cannot spread)"))
    if verdict["first"] != first:
        raise LabCheckFailed(f"on {what}: first_divergent is {verdict['first']!r}; the first broken layer, in call "
                             f"order, is {first!r}")


@pytest.mark.check("harness-flags-perturbed")
def test_harness_flags_perturbed(harness, seed, rng):
    reference = reference_run({}, seed, BATCH)
    names = list(reference)
    cases = [  # (dtype, mode, layers, kind, scale)
        ("float32", "isolated", rng.sample(names, 2), "bf16", 0.0),
        ("float32", "isolated", rng.sample(names, 1), "fp16", 0.0),
        ("float32", "isolated", rng.sample(names, 2), "noise", FP32_NOISE),
        ("bfloat16", "isolated", rng.sample(names, 1), "noise", BF16_NOISE),
        ("float32", "chained", rng.sample(names, 1), rng.choice(("bf16", "fp16")), 0.0),
    ]
    for dtype, mode, layers, kind, scale in cases:
        perturbation = Perturbation(tuple(layers), kind, scale, seed)
        device = device_run({}, seed, BATCH, dtype=dtype, mode=mode, perturb=perturbation)
        broken = f"noise of {scale} x rms" if kind == "noise" else f"layers computed in {kind}"
        what = f"a {dtype} device, {mode}, seed {seed}, with {broken}"
        verdict = _verdict(harness, reference, device, what)
        _require_flags(verdict, layers, reference, device, what, chained=mode == "chained")


def _failure_config(data: dict) -> tuple[dict, int, int, str, str, Perturbation | None]:
    config = data.get("config")
    if not isinstance(config, dict):
        raise LabCheckFailed("raw/failure.json needs `config` (what the stand-in device ran: model, seed, batch, "
                             "dtype, mode, perturb) and `result` (your harness's output on it)")
    model = model_of(config, "failure.json")
    seed, batch, dtype, mode = (config.get(k) for k in ("seed", "batch", "dtype", "mode"))
    if type(seed) is not int or type(batch) is not int or not 1 <= batch <= 64 or dtype not in ("float32", "bfloat16") \
            or mode not in MODES:
        raise LabCheckFailed(f"raw/failure.json config: seed (int), batch (1..64), dtype (float32 or bfloat16), "
                             f"mode ({' or '.join(MODES)}); got {str(config)[:200]}")
    perturb = config.get("perturb")
    if perturb is not None:
        try:
            perturb = Perturbation(layers=tuple(perturb["layers"]), kind=perturb.get("kind", "noise"),
                                   scale=float(perturb.get("scale", 0.0)), seed=int(perturb.get("seed", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LabCheckFailed(f"raw/failure.json: perturb must be {{layers: [...], kind: one of {KINDS}, scale, "
                                 f"seed}} ({exc})") from None
    return model, seed, batch, dtype, mode, perturb


@pytest.mark.check("failure-case")
def test_failure_case(harness, learner, record):
    data = read_raw(learner, "failure.json")
    model, seed, batch, dtype, mode, perturb = _failure_config(data)
    reference = reference_run(model, seed, batch)
    if perturb is not None and not set(perturb.layers) <= set(reference):
        raise LabCheckFailed(f"raw/failure.json perturbs {list(perturb.layers)}, not all layers of the model "
                             f"({list(reference)})")
    device = device_run(model, seed, batch, dtype=dtype, mode=mode, perturb=perturb)
    what = f"your failure case ({dtype}, {mode}, seed {seed}, perturb {perturb})"
    live = _verdict(harness, reference, device, what)
    if live["first"] is None:
        raise LabCheckFailed(f"{what}: your harness finds no layer out of tolerance, so nothing broke. A failure "
                             "case is a dtype or an op where precision breaks: choose one your harness flags")
    recorded = data.get("result")
    recorded = recorded if isinstance(recorded, dict) else {}
    entries = recorded.get("layers") if isinstance(recorded.get("layers"), list) else []
    verdicts = [entry.get("ok") if isinstance(entry, dict) else None for entry in entries]
    if recorded.get("first_divergent") != live["first"] or verdicts != [entry["ok"] for entry in live["layers"]]:
        raise LabCheckFailed(
            f"raw/failure.json records {str(recorded.get('first_divergent'))[:80]!r} "
            f"as the first divergent layer (and its verdicts per layer), but your harness, run now on the judge's "
            f"reproduction of that config, says {live['first']!r} (flagged {live['flagged']}). Rerun "
            "`python run.py --out raw` with your current harness and keep what it writes")
    ours = layer_metrics(reference[live["first"]], device[live["first"]])
    record("failure max abs", ours["max_abs"], label=live["first"])
