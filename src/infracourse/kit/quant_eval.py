"""The course's reference for int8 weight-only quantisation (week 18): the judge's side of every comparison.

    quantize_per_channel(w)     -> (q int8 (out, in), scale fp32 (out,)): symmetric, one scale per output
                                   channel (row), scale = max|w_row| / 127, q = round(w / scale) in [-127, 127]
    QUANTIZED                   the Linear layers a quantised kit GPT stores in int8: every block's
                                   attn.qkv, attn.proj, mlp.up, mlp.down (embeddings, norms and the tied head
                                   stay fp32)
    reference_int8(model)       a copy of `model` whose QUANTIZED weights are dequantised q * scale
    state_tensors(model)        {name: tensor} of its state_dict as a plain dict (what the judge fetches)
    unique_bytes(tensors)       bytes of the distinct storages behind tensors (a tied weight counted once)
    eval_tokens()               the fixed evaluation tokens: seeded prompts continued by the week's target
                                   model's own greedy output (so the fp32 model is confident on them)
    loss_and_agreement(logits, reference_logits, tokens) -> (mean next-token loss, top-1 agreement)

Why per channel: a row's rounding error is at most half ITS scale. One scale for the whole tensor is set by
its largest value anywhere: a single outlier channel makes every other row's step coarse.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from infracourse.kit.generate import seeded_prompts
from infracourse.kit.speculative import batched_greedy, target_model

QUANTIZED = ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")
EVAL_PROMPTS, EVAL_PROMPT_LEN, EVAL_NEW = 4, 16, 48


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.detach().float()
    scale = w.abs().amax(dim=1) / 127  # (out,)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: q = 0 whatever the scale
    q = torch.round(w / safe[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantized_weights(model) -> dict[str, torch.Tensor]:
    """name -> weight of each Linear a quantised model stores in int8."""
    return {f"blocks.{i}.{name}.weight": block.get_submodule(name).weight
            for i, block in enumerate(model.blocks) for name in QUANTIZED}


@torch.no_grad()
def reference_int8(model):
    ref = copy.deepcopy(model)
    for w in quantized_weights(ref).values():
        q, scale = quantize_per_channel(w)
        w.copy_(q.float() * scale[:, None])
    return ref


def state_tensors(model) -> dict[str, torch.Tensor]:
    return {name: t.detach() for name, t in model.state_dict().items()}


def unique_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def eval_tokens() -> torch.Tensor:
    """(EVAL_PROMPTS, EVAL_PROMPT_LEN + EVAL_NEW) token ids, the same on every machine."""
    prompts = seeded_prompts(EVAL_PROMPTS, 256, EVAL_PROMPT_LEN, EVAL_PROMPT_LEN, seed=18)
    new = batched_greedy(target_model(0), prompts, EVAL_NEW)
    return torch.tensor([p + t for p, t in zip(prompts, new)])


def loss_and_agreement(logits: torch.Tensor, reference_logits: torch.Tensor, tokens: torch.Tensor):
    """Mean cross-entropy of predicting tokens[:, 1:] from logits[:, :-1] over the generated part, and the
    fraction of those positions where logits' argmax equals reference_logits' argmax."""
    start = EVAL_PROMPT_LEN - 1  # predictions of the greedy continuation only
    pred = logits[:, start:-1].float()
    loss = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), tokens[:, start + 1:].reshape(-1)).item()
    agree = (pred.argmax(-1) == reference_logits[:, start:-1].float().argmax(-1)).float().mean().item()
    return loss, agree
