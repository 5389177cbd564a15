"""Your cache serves a real checkpoint: the course writes a Llama-style checkpoint in the worker (config.json +
safetensors; RoPE, grouped KV heads, SwiGLU), loads it as a served model is loaded, and your generate runs it;
its tokens and logits must equal the judge's recomputation of the same checkpoint."""
import random

import pytest
import torch

from infracourse.grader import LabCheckFailed, LearnerRaised
from infracourse.kit.generate import seeded_prompts
from infracourse.kit.llama import checkpoint_model, generate
from week15_judging import call_generate

TOL = 1e-4
PIECES = ("model.cfg, model.embed, model.blocks, block.norm1, block.attn (qkv_heads, attend), block.mlp, "
          "block.norm2 and model.logits")


def checkpoint_sizes(seed: int) -> dict:
    """A small Llama drawn from the grade's seed, vocab 256 (the prompts' ids), always with 2 KV heads each shared
    by 2 or 4 query heads: a cache that treats it as multi-head attention (one KV head per query head, or the KV
    heads repeated in the wrong order) gives other tokens in every grade, which a single KV head would hide."""
    r = random.Random(seed)
    heads = r.choice((4, 8))
    return {"layers": r.randint(1, 3), "hidden": heads * r.choice((8, 16)), "heads": heads, "kv_heads": 2,
            "vocab": 256, "intermediate": 32 * r.randint(2, 6), "max_positions": 64}


@pytest.mark.check("checkpoint-tokens")
def test_your_cache_serves_a_checkpoint_read_from_disk(kv, learner, seed):
    sizes = checkpoint_sizes(seed)
    local = checkpoint_model(sizes, seed)
    remote = learner.build(checkpoint_model, sizes, seed)
    r = random.Random(seed + 1)
    for prompt in seeded_prompts(2, 256, 2, 24, seed=seed + 1):
        n = r.randint(6, 64 - len(prompt))
        what = (f"seed {seed}, a checkpoint of {sizes['layers']} layers, {sizes['heads']} heads, "
                f"{sizes['kv_heads']} KV heads, hidden {sizes['hidden']}: a prompt of {len(prompt)} tokens, {n} new")
        try:
            got, got_logits, _ = call_generate(kv, remote, prompt, n, what)
        except LearnerRaised as exc:
            if exc.type_name != "AttributeError":
                raise
            raise LabCheckFailed(f"{what}: your code asked the model for something only the GPT has ({exc}). A "
                                 f"cache that serves any model uses its common pieces only: {PIECES}; the device "
                                 "is next(model.parameters()).device") from None
        tokens = generate(local, torch.tensor([prompt]), n)[0].tolist()
        if got != tokens:
            i = next(i for i, (a, b) in enumerate(zip(got, tokens)) if a != b)
            raise LabCheckFailed(f"{what}: your token {i} is {got[i]}, the checkpoint's model gives {tokens[i]} "
                                 "(tokens before it agree). This model's positions act in attend (RoPE), from the "
                                 "order of the keys you pass: give attend every cached key and value, in order, "
                                 f"the new ones last, and use only {PIECES}")
        with torch.no_grad():
            want = local(torch.tensor([prompt + tokens[:-1]]))[0, len(prompt) - 1:].float()
        err = (got_logits.float() - want).abs().max().item()
        if not torch.allclose(got_logits.float(), want, rtol=TOL, atol=TOL):
            raise LabCheckFailed(f"{what}: tokens agree but your logits differ from the recomputation by up to "
                                 f"{err:.2e} (tolerance {TOL:g}): the cached keys and values must be exactly those "
                                 "the full sequence computes")
