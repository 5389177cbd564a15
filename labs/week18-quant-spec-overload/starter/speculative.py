"""Speculative decoding with greedy verification: a cheap draft model proposes k tokens, the target checks
them all in ONE forward pass, and the output is exactly the target's own greedy output.

    speculative_generate(target, draft, prompts, k, n) -> (tokens, stats)
        prompts   equal-length lists of token ids (a batch of B; B = 1 is one request)
        tokens    B lists of n new token ids, each the target's greedy continuation of its prompt
        stats     {"rounds": [[drafted, accepted], ...] one per target verification,
                   "acceptance_rate": accepted draft tokens / drafted tokens, summed over the rounds}

Both models may run by full recomputation (model(ids) on the whole sequence), as the kit's greedy_generate does.
"""
import torch


@torch.no_grad()
def speculative_generate(target, draft, prompts, k: int, n: int):
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long)  # (B, T): the batch shares one length
    # TODO: rounds until n new tokens: the draft proposes up to k tokens greedily, the target scores
    # context + proposal in one pass, keep the accepted prefix and the target's own next token.
    raise NotImplementedError("speculative_generate: draft, verify in one target pass, accept, repeat")
