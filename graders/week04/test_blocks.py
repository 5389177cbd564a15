"""Week 4 blocks: norm, attention and MLP from tensor ops against the kit's modules, and each stage's layout."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from infracourse.grader import CallRecord, LabCheckFailed, LearnerRaised, BuildInWorker, assert_close, in_worker
from infracourse.kit import probes_autograd
from infracourse.kit.gpt import MLP, Block, CausalSelfAttention, GPTConfig, RMSNorm

CONFIGS = [GPTConfig(d_model=64, n_head=4), GPTConfig(d_model=48, n_head=3, mlp_ratio=2)]
SHAPES = [(2, 7), (1, 1), (3, 33)]  # (batch, seq): one token, and a length that is no power of two
RTOL, ATOL = 1e-4, 1e-5  # fp32: a different summation order than the kit's fused kernels


@pytest.fixture(scope="module")
def blocks(learner):
    return learner.module("blocks")


def _config(cfg: GPTConfig) -> BuildInWorker:
    """The same GPTConfig, built in the worker (a learner's module takes it as its argument)."""
    return in_worker(GPTConfig, **dataclasses.asdict(cfg))


def _compare(learner, mine, reference, x, what, forbidden, rtol=RTOL, atol=ATOL, backward=True, output_atol_scale=None):
    """Same weights, same input: outputs and every gradient must agree; no library op may do the work.
    output_atol_scale: the output's absolute tolerance is this times its largest magnitude (for outputs whose
    elements sum large terms that cancel), instead of atol."""
    try:
        mine.load_state_dict(dict(reference.state_dict()))
    except LearnerRaised as exc:
        if exc.type_name != "RuntimeError":
            raise
        raise LabCheckFailed(f"{what}: the kit's weights do not load into yours ({exc.message[:300]}); keep the "
                             "parameter names and shapes of infracourse.kit.gpt") from None
    reference.to(x.dtype)
    # the kit's weights go in as arguments of the call, so the bridged backward returns their gradients too
    probe = learner.build(probes_autograd.Functional, mine)
    names = probe.names
    weights = dict(reference.named_parameters())
    if not isinstance(names, list) or sorted(names) != sorted(weights):
        raise LabCheckFailed(f"{what}: your module's parameters are {str(names)[:300]}, the kit's "
                             f"{sorted(weights)}; keep the parameter names of infracourse.kit.gpt")
    params = [weights[name].detach().clone().requires_grad_(backward) for name in names]
    x_mine, x_ref = x.clone().requires_grad_(backward), x.clone().requires_grad_(backward)
    result = probe.call((x_mine, *params), watch={"poison": False})
    out, record = result.value, CallRecord.from_evidence(result.record)
    used = sorted({op for op in record.ops + record.profiled if any(name in op for name in forbidden)})
    if used:
        raise LabCheckFailed(f"{what} called {used}: write it from tensor ops (matmul, softmax, erf, ...), not the "
                             "library's fused op")
    expected = reference(x_ref)
    out_atol = atol if output_atol_scale is None else output_atol_scale * max(1.0, expected.abs().max().item())
    assert_close(out, expected, rtol=rtol, atol=out_atol, what=f"{what}: output")
    if not backward:
        return
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    pairs = [("the input", x_mine.grad, x_ref.grad)] + [
        (name, p.grad, weights[name].grad) for name, p in zip(names, params)]
    for name, got, want in pairs:
        # gradients sum many terms that cancel: the absolute tolerance follows their magnitude
        scale = max(1.0, want.abs().max().item())
        assert_close(got, want, rtol=rtol, atol=atol * scale, what=f"{what}: gradient of {name}")


def _cases(seed):
    for cfg in CONFIGS:
        for batch, seq in SHAPES:
            yield cfg, torch.randn(batch, seq, cfg.d_model), f"{cfg.n_head} heads, x {(batch, seq, cfg.d_model)} " \
                                                             f"(seed {seed})"


def _require_through_function(learner, module, x, what):
    """The norm's output graph holds the learner's RMSNormFunction: the block uses the hand-written backward."""
    function = learner.module("rmsnorm_function").RMSNormFunction
    got = learner.build(probes_autograd.norm_nodes, module, function, x)
    if not (isinstance(got, dict) and got.get("through") is True):
        nodes = got.get("nodes") if isinstance(got, dict) else got
        raise LabCheckFailed(f"{what}: the output's autograd graph ({str(nodes)[:200]}) has no RMSNormFunction "
                             "node: RMSNorm.forward must call your rms_norm from rmsnorm_function.py, so its "
                             "backward is the one the block uses")


@pytest.mark.check("block-norm")
def test_norm(learner, blocks, seed):
    for cfg in CONFIGS:
        x = torch.randn(2, 3, cfg.d_model)
        _require_through_function(learner, blocks.RMSNorm(cfg.d_model), x, f"RMSNorm({cfg.d_model}) in fp32")
        _require_through_function(learner, blocks.RMSNorm(cfg.d_model), x.bfloat16(),
                                  f"RMSNorm({cfg.d_model}) in bf16")
    for cfg, x, what in _cases(seed):
        reference = RMSNorm(cfg.d_model)
        with torch.no_grad():
            reference.weight.normal_()
        _compare(learner, blocks.RMSNorm(cfg.d_model), reference, x * 1e-3, f"RMSNorm of {what} x 1e-3",
                 ("rms_norm", "layer_norm"))
        _compare(learner, blocks.RMSNorm(cfg.d_model), reference, x.bfloat16(), f"RMSNorm in bf16 of {what}",
                 ("rms_norm", "layer_norm"), rtol=None, atol=None, backward=False)


@pytest.mark.check("block-attention")
def test_attention(learner, blocks, seed):
    for cfg, x, what in _cases(seed):
        reference = CausalSelfAttention(cfg)
        _compare(learner, blocks.CausalSelfAttention(_config(cfg)), reference, x, f"attention on {what}", ("scaled_dot_product",))
        # scores near 100: exp overflows fp32 unless each row's max is subtracted first; so sharp a softmax
        # magnifies rounding (two near-equal scores trade weight by the order of the additions), and the values
        # are 50x larger too: the absolute tolerance follows them, or an output that cancels to near zero fails
        # an honest order of operations (seen: 1.2e-3 off at -0.37 with bmm then softmax, seed 1089956629)
        _compare(learner, blocks.CausalSelfAttention(_config(cfg)), reference, x * 50, f"attention on {what} x 50",
                 ("scaled_dot_product",), rtol=1e-3, atol=5e-4 * 50, backward=False)


@pytest.mark.check("block-mlp")
def test_mlp(learner, blocks, seed):
    # x 3 puts the hidden units along GELU's curve, x 20 in its tails. Each output and input gradient sums 256
    # products that cancel, and graded through the worker an honest MLP has been seen 1.3e-4 off an output of
    # -0.071 (x 20, seed 2133197519) and 2.6e-5 off an input gradient of -0.045 (seed 504921385): both absolute
    # tolerances are 1e-4 of the largest magnitude. A tanh-approximated GELU still fails on the gradients at x 3,
    # at 2.6x that tolerance or more (1200 cases).
    for cfg, x, what in _cases(seed):
        for scale in (3, 20):
            _compare(learner, blocks.MLP(_config(cfg)), MLP(cfg), x * scale, f"MLP on {what} x {scale}", ("gelu",),
                     atol=1e-4, output_atol_scale=1e-4)


def _kit_layouts(batch, seq, cfg):
    """The layout of each stage as the kit's Block computes it."""
    block = Block(cfg)
    C, H = cfg.d_model, cfg.n_head
    x = torch.randn(batch, seq, C)
    qkv = block.attn.qkv(x)
    q, k, v = (t.view(batch, seq, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
    merged = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, C)
    stages = {"x": x, "qkv": qkv, "q": q, "k_t": k.transpose(-2, -1), "scores": q @ k.transpose(-2, -1),
              "merged": merged, "hidden": block.mlp.up(block.norm2(x))}
    return {name: (tuple(t.shape), t.stride()) for name, t in stages.items()}


@pytest.mark.check("block-layouts")
def test_layouts(blocks):
    for cfg, (batch, seq) in [(CONFIGS[0], (2, 5)), (CONFIGS[1], (3, 7))]:
        got = blocks.layouts(batch, seq, _config(cfg))
        for stage, (shape, stride) in _kit_layouts(batch, seq, cfg).items():
            if stage not in got:
                raise LabCheckFailed(f"layouts() has no entry for stage {stage!r}")
            mine_shape, mine_stride = (tuple(v) for v in got[stage])
            # a dim of size 1 is never stepped along: its stride is not part of the layout
            same = mine_shape == shape and all(a == b for a, b, n in zip(mine_stride, stride, shape) if n != 1)
            if not same or len(mine_stride) != len(stride):
                raise LabCheckFailed(
                    f"layouts({batch}, {seq}, d_model={cfg.d_model}, n_head={cfg.n_head})[{stage!r}] is "
                    f"{mine_shape} with strides {mine_stride}; the kit's Block has {shape} with strides {stride}. "
                    "Slicing, view and transpose change strides without moving data; matmul writes a new tensor.")
