"""Reference greedy generation with the kit's GPT, by full recomputation (no cache): the ground truth that
cached, batched and served generation must reproduce token for token.

    greedy_generate(model, prompt_ids, max_new_tokens)          -> list[int] of new tokens
    greedy_generate(..., return_logits=True)                    -> (tokens, logits (max_new_tokens, vocab) fp32)
    greedy_stream(model, prompt_ids, max_new_tokens)            -> iterator of new token ids, one per step
    seeded_prompts(n, vocab_size, min_len, max_len, seed=...)   -> n prompts (lists of ids) of seeded lengths

Every step runs the whole sequence so far through `model(idx)` and takes the argmax of the last position's
logits (ties go to the lowest id, torch.argmax's rule). prompt + new tokens must fit `model.cfg.seq_len`.
"""
from __future__ import annotations

import random
from typing import Iterator, Sequence

import torch


def _as_ids(prompt_ids, device) -> torch.Tensor:
    ids = torch.as_tensor(prompt_ids if not isinstance(prompt_ids, torch.Tensor) else prompt_ids.cpu(),
                          dtype=torch.long)
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"prompt_ids must be a non-empty 1-D sequence of token ids, got shape {tuple(ids.shape)}")
    return ids.to(device)


def _check_fits(model, n_prompt: int, max_new_tokens: int) -> None:
    if n_prompt + max_new_tokens > model.cfg.seq_len:
        raise ValueError(f"prompt of {n_prompt} + {max_new_tokens} new tokens exceeds seq_len {model.cfg.seq_len}")


@torch.no_grad()
def greedy_stream(model, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int) -> Iterator[int]:
    device = next(model.parameters()).device
    seq = _as_ids(prompt_ids, device)
    _check_fits(model, seq.numel(), max_new_tokens)
    for _ in range(max_new_tokens):
        nxt = model(seq[None])[0, -1].float().argmax()
        seq = torch.cat([seq, nxt[None]])
        yield int(nxt)


@torch.no_grad()
def greedy_generate(model, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
                    return_logits: bool = False):
    device = next(model.parameters()).device
    seq = _as_ids(prompt_ids, device)
    _check_fits(model, seq.numel(), max_new_tokens)
    tokens, logits = [], []
    for _ in range(max_new_tokens):
        last = model(seq[None])[0, -1].float()  # (vocab,)
        nxt = last.argmax()
        tokens.append(int(nxt))
        logits.append(last.cpu())
        seq = torch.cat([seq, nxt[None]])
    if return_logits:
        return tokens, (torch.stack(logits) if logits else torch.empty(0, model.cfg.vocab_size))
    return tokens


def seeded_prompts(n: int, vocab_size: int, min_len: int, max_len: int, *, seed: int) -> list[list[int]]:
    """n prompts with lengths drawn uniformly from [min_len, max_len] and ids from [0, vocab_size)."""
    r = random.Random(seed)
    return [[r.randrange(vocab_size) for _ in range(r.randint(min_len, max_len))] for _ in range(n)]


def count_work(model) -> None:
    """The judge's model wrapper, built in the worker around the model a learner's generate runs: every call of
    `model.embed` (where each forward pass starts, the GPT's and the checkpoint model's alike) is logged as
    (tokens embedded, position offset); `work_done(model)` returns the log and empties it."""
    if hasattr(model, "_work_log"):
        return
    log: list[tuple[int, int]] = []
    embed = model.embed

    def counted(ids, *args, **kwargs):
        offset = args[0] if args else kwargs.get("pos_offset", 0)
        log.append((int(ids.numel()), int(offset)))
        return embed(ids, *args, **kwargs)

    object.__setattr__(model, "embed", counted)
    object.__setattr__(model, "_work_log", log)


def work_done(model) -> list[tuple[int, int]]:
    """The (tokens, position offset) of each model.embed call since the last read (count_work), oldest first."""
    log = model._work_log
    out, log[:] = list(log), []
    return out
