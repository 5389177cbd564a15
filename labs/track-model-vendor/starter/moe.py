"""A small mixture-of-experts layer: top-k routing, a dense single-process baseline, load statistics, an
EPLB-style placement of redundant experts, and the expert-parallel layer whose dispatch and combine go
through all_to_all. Every function is graded against the course's reference (infracourse.kit.moe)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def route(logits, top_k):
    """(expert ids (T, k) long, gates (T, k)): the k largest logits of each token, best first; the gates are the
    softmax over those k logits (so a token's gates sum to 1)."""
    raise NotImplementedError("route: topk of the logits, then a softmax over the k values")


def keep_within_capacity(expert, capacity, experts):
    """(T, k) bool: an assignment (token t, choice j) is kept when fewer than `capacity` assignments to the same
    expert came before it in row-major (token, choice) order. capacity None: everything is kept."""
    raise NotImplementedError("keep_within_capacity: each assignment's place in its expert's queue")


def dense_moe(x, logits, w_in, w_out, top_k, capacity):
    """One process, every expert here. x (T, d), logits (T, E), w_in (E, d, ffn), w_out (E, ffn, d). Expert e
    computes gelu(rows @ w_in[e]) @ w_out[e]; out[t] = sum over t's KEPT choices of gate x expert(x[t]) (no
    renormalisation after a drop). Returns {"out": (T, d), "dropped": int}."""
    raise NotImplementedError("dense_moe: the single-process baseline")


def routing_stats(expert, experts, world):
    """expert (N, k): every token's chosen experts. Returns {"tokens_per_expert": [E ints], "tokens_per_rank":
    [world ints] with expert e on rank e // (experts / world), "expert_imbalance": max/mean,
    "rank_imbalance": max/mean}."""
    raise NotImplementedError("routing_stats: count assignments per expert and per rank")


def eplb_placement(load, world, slots):
    """load: tokens per logical expert. Returns a list of `world` lists of `slots` expert ids: every expert at
    least once, the spare slots spent on replicas of hot experts, so that the busiest rank's load (each expert's
    tokens split evenly over its replicas) is as low as you can make it."""
    raise NotImplementedError("eplb_placement: replicate hot experts, then pack the replicas onto ranks")


def ep_moe(x, logits, experts, placement, top_k, capacity):
    """Expert-parallel MoE on this rank (torch.distributed is initialised: gloo on CPU, NCCL on GPU).
    x (T, d), logits (T, E): this rank's tokens. placement[r]: the logical experts rank r holds, one per slot
    (the same on every rank; an expert may appear on several ranks). experts[i]: this rank's module for slot
    i (call it on a (n, d) tensor of rows). Dispatch each kept assignment to one replica of its expert with
    all_to_all, combine the results back the same way. Returns {"out": (T, d), "dropped": assignments past
    capacity on this rank, "load": [token rows each local slot's expert processed]}."""
    raise NotImplementedError("ep_moe: dispatch with all_to_all, run the local experts, combine back")
