"""Week 3: two ways to batch variable-length sequences for a position-wise model (reference solution).

A scheme turns a list of 1-D token tensors into one tensor for the model and a function that cuts the
model's output back into one (length_i, vocab) tensor per sequence.
"""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence


def pad(seqs: list[torch.Tensor]):
    """Pad every sequence to the longest: tokens (B, L_max). The model computes the padding too."""
    lengths = [len(s) for s in seqs]
    tokens = pad_sequence(seqs, batch_first=True)  # (B, L_max), zeros after each sequence's end

    def unpack(logits: torch.Tensor) -> list[torch.Tensor]:  # (B, L_max, V) -> [(len_i, V)]
        return [logits[i, :n] for i, n in enumerate(lengths)]

    return tokens, unpack


def pack(seqs: list[torch.Tensor]):
    """Concatenate the sequences: tokens (N,), N = the real tokens only. Exact for a position-wise model."""
    lengths = [len(s) for s in seqs]

    def unpack(logits: torch.Tensor) -> list[torch.Tensor]:  # (N, V) -> [(len_i, V)]
        return list(logits.split(lengths))

    return torch.cat(seqs), unpack


def run(scheme, model, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The model's output for each sequence, computed through `scheme`."""
    tokens, unpack = scheme(seqs)
    return unpack(model(tokens))
