"""Pipeline parallelism: GPipe and 1F1B schedules, their bubble, and a 2-stage runner over send/recv.

A schedule is a list of time steps; each time step lists what the stages do in it, as (stage, microbatch,
'F' or 'B'). A forward and a backward each take one time step, and a stage does one thing at a time.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def bubble_fraction(stages, microbatches):
    """The idle share of each stage's time in a synchronous schedule (forward and backward equally long)."""
    raise NotImplementedError("TODO: bubble_fraction")


def gpipe_schedule(stages, microbatches):
    """GPipe: every microbatch forward through the pipeline, then every backward."""
    raise NotImplementedError("TODO: gpipe_schedule")


def one_f_one_b_schedule(stages, microbatches):
    """1F1B: warm-up forwards, then one forward and one backward in turn, then the remaining backwards."""
    raise NotImplementedError("TODO: one_f_one_b_schedule")


def two_stage_step(weight, bias, data, microbatches):
    """One training step of a 2-stage pipeline. Rank 0 holds stage 0, h = tanh(x @ w.T + b), and `data` is the
    inputs x; rank 1 holds stage 1, out = h @ w.T + b, and `data` is the targets. The loss is the mean squared
    error over the whole batch. Leaves each stage's gradients in weight.grad and bias.grad; returns the loss on
    rank 1 and None on rank 0."""
    raise NotImplementedError("TODO: two_stage_step")
