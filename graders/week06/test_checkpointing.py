"""Week 6 activation checkpointing: the learner's checkpointed forward against the kit's plain one, on a kit
GPT built in the worker with the judge's weights (kit.probes_step.checkpoint_evidence).

Judged by effect: the loss and every gradient equal the plain forward's; the bytes the forward pass leaves
allocated (torch.profiler's memory records, whoever holds the tensors) fall to at most half; forward ops run
again during backward (the memory is saved by recomputing, not by dropping gradients). The time the
recomputation costs is measured and recorded for the report."""
import dataclasses

import pytest
import torch

from infracourse.grader import LabCheckFailed, assert_close, in_worker
from infracourse.kit import probes_step
from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch

CONFIG, BATCH = GPTConfig(vocab_size=64, seq_len=64, d_model=64, n_head=4, n_layer=4), 8
MAX_RETAINED = 0.5  # of what the plain forward leaves allocated (the solution: about 0.11)


def _evidence(learner, loss_fn, weights, inputs, targets) -> dict:
    got = learner.build(probes_step.checkpoint_evidence, loss_fn, in_worker(GPTConfig, **dataclasses.asdict(CONFIG)),
                        weights, inputs, targets)
    ok = isinstance(got, dict) and all(type(got.get(k)) is int for k in ("retained", "recomputed")) \
        and isinstance(got.get("seconds"), float) and isinstance(got.get("grads"), dict) \
        and isinstance(got.get("loss"), torch.Tensor)
    if not ok:
        raise LabCheckFailed(f"the measurement of the checkpointed forward came back malformed ({str(got)[:200]})")
    return got


@pytest.mark.check("checkpoint-activations")
def test_checkpointing(learner, seed, record):
    loss_fn = learner.module("checkpointing").checkpointed_loss
    weights = {k: v.detach() for k, v in GPT(CONFIG, seed=seed % 1000).state_dict().items()}
    inputs, targets = synthetic_batch(CONFIG, BATCH, seed=seed)
    plain = _evidence(learner, None, weights, inputs, targets)
    mine = _evidence(learner, loss_fn, weights, inputs, targets)
    what = f"checkpointed_loss on {CONFIG}, batch {BATCH} (seed {seed})"
    assert_close(mine["loss"], plain["loss"], rtol=1e-6, atol=1e-7, what=f"{what}: the loss")
    for name, want in plain["grads"].items():
        assert_close(mine["grads"].get(name), want, rtol=1e-5, atol=1e-7, what=f"{what}: the gradient of {name}")
    ratio = mine["retained"] / plain["retained"]
    record("bytes left allocated by the forward, plain", plain["retained"], unit="B")
    record("bytes left allocated by the forward, checkpointed", mine["retained"], unit="B")
    record("forward+backward time, checkpointed / plain", mine["seconds"] / plain["seconds"])
    if ratio > MAX_RETAINED:
        raise LabCheckFailed(
            f"{what}: the forward pass leaves {mine['retained']:,} bytes allocated, {ratio:.0%} of the plain "
            f"forward's {plain['retained']:,} (at most {MAX_RETAINED:.0%}). Call every block through "
            "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) and keep no activation yourself.")
    if mine["recomputed"] <= plain["recomputed"]:
        raise LabCheckFailed(
            f"{what}: the backward pass ran no forward op again ({mine['recomputed']} against {plain['recomputed']} "
            "plain), so the memory was not saved by recomputation: checkpoint the blocks, do not detach them")
