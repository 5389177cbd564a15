"""Week 3: two ways to batch variable-length sequences for a position-wise model.

A scheme turns a list of 1-D token tensors into one tensor for the model and a function that cuts the
model's output back into one (length_i, vocab) tensor per sequence. Write pad and pack.
"""
from __future__ import annotations

import torch


def pad(seqs: list[torch.Tensor]):
    """Pad every sequence to the longest: return (tokens (B, L_max), unpack). unpack(logits (B, L_max, V))
    returns [logits of sequence i, shape (len_i, V)]."""
    # TODO(week03): torch.nn.utils.rnn.pad_sequence; unpack keeps each row's first len_i positions.
    raise NotImplementedError("pad(): build the (B, L_max) batch and its unpack function")


def pack(seqs: list[torch.Tensor]):
    """Concatenate the sequences: return (tokens (N,), unpack), N = the real tokens only.
    unpack(logits (N, V)) returns [logits of sequence i, shape (len_i, V)]."""
    # TODO(week03): torch.cat, and split the output by the sequences' lengths.
    raise NotImplementedError("pack(): concatenate the sequences and split the output back")


def run(scheme, model, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The model's output for each sequence, computed through `scheme`."""
    tokens, unpack = scheme(seqs)
    return unpack(model(tokens))
