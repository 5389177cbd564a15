"""Int8 weight-only quantisation, judged with the course's reference (infracourse.kit.quant_eval).

quant-error    quantize(w) on seeded weights with an outlier channel and all-zero rows: int8 values, one scale
               per output channel, each as small as the row allows (max|row| / 127), and every element's
               error |w - q * scale| within its row's scale / 2 (what rounding to the nearest step gives).
quant-memory   the bytes of quantize_model(target)'s state_dict, measured here (distinct storages, so the tied
               embedding/head counts once): the quantised Linears must shrink by at least lab.yaml's factor
               against their fp32 bytes (int8 + one scale per row: about 4x).
quant-quality  the quantised model's logits on the fixed eval tokens equal the course's int8 reference (so the
               int8 weights are what it computes with); its loss change and top-1 agreement with the fp32
               model are measured here, for the report.
"""
import pytest
import torch

from infracourse.kit import quant_eval
from infracourse.kit.speculative import target_model
from week18_judging import learner_quant, require

EPS = 1e-6  # fp32 rounding of w / scale and q * scale


@pytest.fixture(scope="module")
def quant(learner):
    return learner_quant(learner)


def seeded_weight(seed: int, rows: int, cols: int) -> tuple[torch.Tensor, str]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    w[3, 5] = 4.0          # an outlier channel: one large weight in row 3
    w[7] = 0.0             # an all-zero row
    w[rows - 1] *= 1e-3    # a row of tiny weights: its step must be tiny too
    return w, f"a seeded ({rows}, {cols}) weight (seed {seed}) with an outlier in row 3, row 7 all zero, the last row tiny"


@pytest.mark.check("quant-error")
def test_error_within_half_a_step_per_channel(quant, seed):
    for rows, cols in ((16, 40), (24, 33)):
        w, what = seeded_weight(seed + rows, rows, cols)
        out = quant.quantize(w.clone())
        require(isinstance(out, tuple) and len(out) == 2, f"{what}: quantize must return (q, scale), got "
                f"{type(out).__name__}")
        q, scale = out
        require(isinstance(q, torch.Tensor) and q.dtype == torch.int8 and tuple(q.shape) == (rows, cols),
                f"{what}: q must be an int8 tensor of shape ({rows}, {cols}), got "
                f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
        require(isinstance(scale, torch.Tensor) and scale.numel() == rows and scale.is_floating_point(),
                f"{what}: scale must be a float tensor of {rows} values, one per output channel (row), got "
                f"{tuple(getattr(scale, 'shape', ()))}: one scale for the whole tensor lets the outlier set every "
                "row's step")
        s = scale.reshape(rows).double()
        require(bool(torch.isfinite(s).all()) and bool((s >= 0).all()), f"{what}: every scale must be finite and "
                f"non-negative; row 7 (all zero) gives {s[7].item()!r}: divide by a safe scale there")
        amax = w.double().abs().amax(1)
        loose = s > amax / 127 * (1 + 1e-5) + 1e-12
        if loose.any():
            r = int(loose.nonzero()[0])
            raise AssertionError(
                f"{what}: row {r}'s scale is {s[r].item():.3g}, but its largest magnitude / 127 is "
                f"{(amax[r] / 127).item():.3g}: each row's scale must come from that row alone (max|row| / 127), "
                "or its small weights lose their precision")
        err = (w.double() - q.double() * s[:, None]).abs()
        over = err > s[:, None] / 2 + EPS * (1 + s[:, None])
        if over.any():
            r, c = (int(i) for i in over.nonzero()[0])
            raise AssertionError(
                f"{what}: element ({r}, {c}) = {w[r, c].item():.6g} dequantises to "
                f"{(q[r, c].double() * s[r]).item():.6g} (q = {int(q[r, c])}, scale {s[r].item():.4g}): the error "
                f"{err[r, c].item():.3g} exceeds scale / 2. Round to the NEAREST step (torch.round, not a cast, "
                "which truncates) and clamp to [-127, 127] before the int8 cast, which wraps around")


@pytest.mark.check("quant-memory")
def test_quantised_model_is_smaller(quant, learner, record, lab_check):
    model = target_model(0)
    qmodel = quant.quantize_model(learner.build(target_model, 0))
    state = learner.build(quant_eval.state_tensors, qmodel)  # fetched: measured here
    require(isinstance(state, dict) and all(isinstance(t, torch.Tensor) for t in state.values()),
            "quantize_model(model).state_dict() must hold tensors")
    linear = quant_eval.quantized_weights(model)
    fp32_bytes = quant_eval.unique_bytes(model.state_dict().values())
    rest = fp32_bytes - quant_eval.unique_bytes(linear.values())  # embeddings, norms: kept in fp32
    got = quant_eval.unique_bytes(state.values())
    int8 = sum(t.numel() for t in state.values() if t.dtype == torch.int8)
    numel = sum(w.numel() for w in linear.values())
    require(int8 >= numel, f"the quantised model's state_dict holds {int8} int8 values, the block Linears "
            f"(attn.qkv, attn.proj, mlp.up, mlp.down) have {numel} weights: store them as int8 buffers "
            "(register_buffer), so they are part of the model")
    factor = sum(w.numel() * 4 for w in linear.values()) / max(got - rest, 1)
    record("fp32 weight bytes", fp32_bytes, unit="B", bytes=fp32_bytes)
    record("int8 weight bytes", got, unit="B", bytes=got)
    record("linear memory factor", factor, target=lab_check.threshold, unit="x")
    require(factor >= lab_check.threshold,
            f"the whole state_dict is {got} bytes; less the fp32 embeddings and norms ({rest} bytes) the quantised "
            f"Linears take {got - rest} bytes against {fp32_bytes - rest} in fp32: {factor:.2f}x smaller, at least "
            f"{lab_check.threshold:g}x expected (1 byte per weight + one scale per row). Keep no fp32 copy of the "
            "weights in the module")


@pytest.mark.check("quant-quality")
def test_quality_measured_against_reference(quant, learner, record):
    model = target_model(0)
    tokens = quant_eval.eval_tokens()
    qmodel = quant.quantize_model(learner.build(target_model, 0))
    got = qmodel(tokens)
    require(isinstance(got, torch.Tensor) and tuple(got.shape) == (*tokens.shape, 256),
            f"quantize_model(model)(tokens) must give ({tokens.shape[0]}, {tokens.shape[1]}, 256) logits, got "
            f"{tuple(getattr(got, 'shape', ()))}")
    with torch.no_grad():
        full = model(tokens)
        ref = quant_eval.reference_int8(model)(tokens)
    to_ref = (got.double() - ref.double()).abs().max().item()
    quant_change = (full.double() - ref.double()).abs().max().item()
    require(to_ref <= 0.05 * quant_change,
            f"on the fixed eval tokens ({tokens.shape[0]} x {tokens.shape[1]}) your quantised model's logits differ "
            f"from the course's per-channel int8 model by up to {to_ref:.3g}; quantisation itself changes them by "
            f"{quant_change:.3g}. It must compute with its int8 weights times their per-row scales"
            + (" (yours looks unquantised)" if (got.double() - full.double()).abs().max().item() < 0.05 * quant_change
               else ""))
    loss_fp32, _ = quant_eval.loss_and_agreement(full, full, tokens)
    loss_int8, agree = quant_eval.loss_and_agreement(got, full, tokens)
    record("eval loss fp32", loss_fp32, unit="nats")
    record("eval loss int8", loss_int8, unit="nats")
    record("loss change", loss_int8 - loss_fp32, unit="nats")
    record("greedy agreement", agree, unit="fraction")
