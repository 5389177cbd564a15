"""Week 23, an estimate: the learner's model FLOPs per training step, checked against the course's formula on
several configurations and against the FLOPs torch counts in a step; then MFU from the judge's step time."""
import dataclasses

import pytest

from infracourse.grader import build_inputs, check_formula, check_measured, tokens
from infracourse.kit import hotspot
from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.probes import GPTTrainer
from track_nvidia_judging import judge_seconds, model_flops_per_step

CONFIGS = [  # (config, tokens): widths, depths, a vocabulary larger than d_model, grouped KV heads, mlp_ratio
    (GPTConfig(vocab_size=256, seq_len=64, d_model=128, n_head=4, n_layer=2), 256),
    (GPTConfig(vocab_size=50304, seq_len=1024, d_model=768, n_head=12, n_layer=12), 524288),
    (GPTConfig(vocab_size=512, seq_len=32, d_model=64, n_head=4, n_layer=3, n_kv_head=2), 96),
    (GPTConfig(vocab_size=1000, seq_len=256, d_model=256, n_head=8, n_layer=6, mlp_ratio=2), 4096),
]


def _reference(config: dict, tokens: int) -> int:
    return model_flops_per_step(GPTConfig(**config), tokens)


def _peak_tflops(hardware, device) -> tuple[float, str]:
    if str(device).startswith("cuda"):
        from infracourse.hardware import calibrate

        return calibrate(hardware).matmul_tflops["bfloat16"], "the calibrated bf16 matmul ceiling of this GPU"
    return hotspot.cpu_matmul_tflops(), "a torch.mm fp32 (512x512) rate the grader measured on one thread of this CPU"


@pytest.mark.check("mfu-estimate")
def test_mfu_estimate(learner, baseline, size, device, hardware, record):
    estimates = learner.module("estimates")
    cases = [{"config": dataclasses.asdict(cfg), "tokens": n} for cfg, n in CONFIGS]
    check_formula("model_flops_per_step", estimates.model_flops_per_step, _reference, cases)
    config = dataclasses.asdict(size.config)
    estimate = estimates.model_flops_per_step(config, size.tokens)
    # the measurement: FLOPs torch counts in one forward + backward at the project's size (course code only)
    model = GPT(size.config, seed=0).to(device, size.dtype)
    idx, targets = build_inputs(tokens(config, size.batch, device=device, seed=5))(0)
    counted, with_attention = hotspot.counted_flops(model, idx, targets)
    if not with_attention:  # flash attention for CPU has no flop formula: its QK^T and AV added by the formula
        counted += 3 * size.tokens * size.config.n_layer * 4 * size.config.seq_len * size.config.d_model
    check_measured("model FLOPs per step", estimate, counted, 1.1)
    peak, source = _peak_tflops(hardware, device)
    # the step timed again beside the peak, the faster window kept: both sides of the ratio from calm moments
    trainer = GPTTrainer(size.config, None, seed=0, device=device, dtype=size.dtype)
    batches = tokens(config, size.batch, device=device, seed=6)
    step_s = min(baseline.step_s, judge_seconds(trainer, build_inputs(batches)(0), device, make_args=batches))
    mfu = estimate / (step_s * peak * 1e12)
    record("model FLOPs per step", float(estimate), target=float(counted), unit="FLOP",
           reference="torch's FlopCounterMode" + ("" if with_attention else ", attention from the formula (CPU)"))
    record("peak TFLOP/s", peak, unit="TFLOP/s", reference=source)
    record("MFU of the baseline step", mfu, unit="", seconds=step_s, flops=float(estimate))
