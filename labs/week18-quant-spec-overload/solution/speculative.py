"""Speculative decoding with greedy verification: a cheap draft model proposes k tokens, the target checks
them all in ONE forward pass, and the output is exactly the target's own greedy output.

    speculative_generate(target, draft, prompts, k, n) -> (tokens, stats)
        prompts   equal-length lists of token ids (a batch of B; B = 1 is one request)
        tokens    B lists of n new token ids, each the target's greedy continuation of its prompt
        stats     {"rounds": [[drafted, accepted], ...] one per target verification,
                   "acceptance_rate": accepted draft tokens / drafted tokens, summed over the rounds}

Both models run by full recomputation (model(ids) on the whole sequence), as the kit's greedy_generate does.
"""
import torch


@torch.no_grad()
def speculative_generate(target, draft, prompts, k: int, n: int):
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long)  # (B, T): the batch shares one length
    start, rounds = ids.shape[1], []
    while ids.shape[1] - start < n:
        left = n - (ids.shape[1] - start)
        d = min(k, left - 1)  # the target adds one token of its own: never draft past the n-th
        proposal = ids
        for _ in range(d):  # the draft guesses greedily, one token at a time
            nxt = draft(proposal)[:, -1].argmax(-1, keepdim=True)
            proposal = torch.cat([proposal, nxt], 1)
        # one target pass scores every proposed position: best[:, i] is its greedy token after i drafted ones
        best = target(proposal)[:, ids.shape[1] - 1:].argmax(-1)  # (B, d + 1)
        guessed = proposal[:, ids.shape[1]:]  # (B, d)
        # accepted = the longest prefix where the draft guessed the target's token; in a batch every
        # sequence keeps one length, so the round keeps the shortest accepted prefix
        matched = (guessed == best[:, :d]).long().cumprod(1).sum(1)
        accepted = int(matched.min()) if d else 0
        rounds.append([d, accepted])
        # the accepted guesses are the target's own tokens; best[:, accepted] is the target's next one
        ids = torch.cat([ids, best[:, :accepted + 1]], 1)
    drafted = sum(r[0] for r in rounds)
    rate = sum(r[1] for r in rounds) / drafted if drafted else 0.0
    return ids[:, start:].tolist(), {"rounds": rounds, "acceptance_rate": rate}
