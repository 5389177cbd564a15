"""`set_intra_op_threads(n)`: the grading worker's torch intra-op thread count, set from the judge.

Graders that compare a learner's CPU timing with their own run both with one intra-op thread (see
infracourse.kit.threads for why a tiny op needs that on a shared machine); the worker is another process,
so the judge builds `BuildInWorker("infracourse.kit.intra_op:set_intra_op_threads", (1,))` there once.
"""
from __future__ import annotations


def set_intra_op_threads(n: int) -> int:
    """Set this process's torch intra-op threads to n; returns the count it had before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    return before
