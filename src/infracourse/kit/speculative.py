"""A draft/target pair of the kit's GPT for speculative decoding (week 18), and the judge's recount of a run.

    target_model(seed)  8 layers, d_model 128: the model whose greedy output must come out
    draft_model(seed)   the target's FIRST layer with the target's embeddings, final norm and head: 1/8 of
                        the layers, so it guesses the target's next token often (about 3 times in 4 here)
    CountedModel(m)     m with counters of forward calls (`calls`) and token positions run (`tokens`): the
                        judge's view of how much the target and the draft computed
    batched_greedy(model, prompts, n)   greedy generation of equal-length prompts as one batch, by full
                        recomputation: the baseline speculation is timed against
    replay(target, draft, prompts, n, rounds) -> (accepted per round, message): the judge's recount

Why the pair agrees: weights are seeded as in kit.gpt, then the first block is scaled up (STRONG) so it
decides most of each next token, and the later blocks only a little (WEAK) so they sometimes change it. A
draft of random unrelated weights would almost never agree, and speculation would be pure cost.

Greedy verification is deterministic: in a round the draft proposes d tokens greedily from the context, the
target scores context + proposal in one forward pass, and the accepted tokens are the longest prefix of the
proposal equal to the target's own greedy tokens; the target's token after that prefix is appended too (the
correction, or the bonus when all d were accepted). So the target's greedy output, computed once, fixes how
many tokens every round can accept, which is what `replay` checks. In a batch (equal-length prompts, one
shared length), a round accepts the prefix that EVERY sequence accepted: the minimum over the batch.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from infracourse.kit.generate import greedy_generate
from infracourse.kit.gpt import GPT, GPTConfig

TARGET_CFG = GPTConfig(vocab_size=256, seq_len=128, d_model=128, n_head=4, n_layer=8)
DRAFT_LAYERS = 1
STRONG, WEAK = 10.0, 2.5


@torch.no_grad()
def target_model(seed: int = 0) -> GPT:
    model = GPT(TARGET_CFG, seed=seed)
    for i, block in enumerate(model.blocks):
        for linear in (block.attn.qkv, block.attn.proj, block.mlp.up, block.mlp.down):
            linear.weight.mul_(STRONG if i < DRAFT_LAYERS else WEAK)
    return model.eval()


@torch.no_grad()
def draft_model(seed: int = 0) -> GPT:
    """The target's first DRAFT_LAYERS blocks, its embeddings, final norm and (tied) head."""
    target = target_model(seed)
    cfg = GPTConfig(**{**TARGET_CFG.__dict__, "n_layer": DRAFT_LAYERS})
    draft = GPT(cfg, seed=seed)
    keep = {k: v for k, v in target.state_dict().items()
            if not k.startswith("blocks.") or int(k.split(".")[1]) < DRAFT_LAYERS}
    draft.load_state_dict(keep)
    return draft.eval()


class CountedModel(nn.Module):
    """`model` with a count of its forward calls and of the token positions they ran, for the judge: `calls` is
    how many times it ran, `tokens` how many positions (batch x length) those calls processed."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.calls = 0
        self.tokens = 0

    def forward(self, idx: torch.Tensor, *args, **kwargs):
        self.calls += 1
        self.tokens += int(idx.numel())
        return self.model(idx, *args, **kwargs)


def counts(model: CountedModel) -> tuple[int, int]:
    """(calls, tokens) of a CountedModel so far, read in the worker where it runs."""
    return model.calls, model.tokens


@torch.no_grad()
def batched_greedy(model, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long)  # (B, T): equal lengths
    start = ids.shape[1]
    for _ in range(n):
        nxt = model(ids)[:, -1].float().argmax(-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, nxt], 1)
    return ids[:, start:].tolist()


def replay(target, draft, prompts: Sequence[Sequence[int]], n: int, rounds) -> tuple[list[int], str | None]:
    """Replays a run's rounds [[drafted, accepted], ...] on equal-length `prompts`: each round's accepted count
    recomputed from the target's greedy output and the draft's greedy proposal at that point. Returns (the
    accepted counts it finds, None) or (what it found so far, a message saying what is wrong)."""
    if not prompts or len({len(p) for p in prompts}) != 1:
        raise ValueError("replay takes one or more prompts of equal length")
    # the target's greedy tokens past n too: a run may draft beyond the n-th token in its last round and trim
    drafts = [r[0] for r in rounds if isinstance(r, (list, tuple)) and r and type(r[0]) is int and r[0] > 0]
    extra = min(max(drafts, default=0), target.cfg.seq_len - len(prompts[0]) - n)
    truth = [greedy_generate(target, p, n + max(extra, 0)) for p in prompts]
    done, found = 0, []
    for j, round_ in enumerate(rounds):
        if done >= n:
            return found, f"round {j} comes after all {n} tokens were produced (round list too long)"
        drafted = round_[0]
        if type(drafted) is not int or drafted < 0:
            return found, f"round {j}: drafted {drafted!r} is not a count of tokens"
        if len(prompts[0]) + done + drafted > draft.cfg.seq_len:
            return found, f"round {j} drafts {drafted} tokens past the model's {draft.cfg.seq_len} positions"
        common = drafted
        for p, t in zip(prompts, truth):
            avail = min(drafted, len(t) - done)  # the target's greedy tokens known past `done`
            proposal = greedy_generate(draft, list(p) + t[:done], drafted) if drafted else []
            m = 0
            while m < avail and proposal[m] == t[done + m]:
                m += 1
            common = min(common, m)
        found.append(common)
        done += common + 1
    if done < n:
        return found, f"the rounds produce {done} tokens, {n} were asked for (round list too short)"
    return found, None
