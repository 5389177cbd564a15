"""A small mixture-of-experts layer: top-k routing, a dense single-process baseline, load statistics, an
EPLB-style placement of redundant experts, and the expert-parallel layer whose dispatch and combine go
through all_to_all (sort-based: the kept assignments are sorted by destination rank, then sent as one block
per rank)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def route(logits, top_k):
    """(expert ids (T, k), gates (T, k)): the k largest logits, best first; gates = softmax over those k."""
    top, expert = logits.topk(top_k, dim=-1)
    return expert, torch.softmax(top, dim=-1)


def keep_within_capacity(expert, capacity, experts):
    """(T, k) bool: an assignment is kept when fewer than `capacity` assignments to the same expert came
    before it in row-major (token, choice) order. capacity None: everything is kept."""
    if capacity is None:
        return torch.ones_like(expert, dtype=torch.bool)
    onehot = F.one_hot(expert.reshape(-1), experts)
    place = (onehot.cumsum(0) * onehot).sum(1) - 1        # this assignment's place in its expert's queue
    return (place < capacity).reshape(expert.shape)


def dense_moe(x, logits, w_in, w_out, top_k, capacity):
    """One process, every expert here: out[t] = sum over t's kept choices of gate * expert(x[t]).
    w_in (E, d, ffn), w_out (E, ffn, d). Returns {"out": (T, d), "dropped": int}."""
    experts = w_in.shape[0]
    expert, gate = route(logits, top_k)
    kept = keep_within_capacity(expert, capacity, experts)
    out = torch.zeros_like(x)
    for e in range(experts):
        token, choice = ((expert == e) & kept).nonzero(as_tuple=True)
        if len(token):
            y = F.gelu(x[token] @ w_in[e]) @ w_out[e]
            out.index_add_(0, token, gate[token, choice, None] * y)
    return {"out": out, "dropped": int((~kept).sum())}


def imbalance(loads):
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


def routing_stats(expert, experts, world):
    """expert (N, k): every token's chosen experts (all ranks' tokens). Tokens per expert, tokens per rank when
    expert e lives on rank e // (experts / world), and the max/mean imbalance of each."""
    per_expert = torch.bincount(expert.reshape(-1), minlength=experts).tolist()
    per = experts // world
    per_rank = [sum(per_expert[r * per:(r + 1) * per]) for r in range(world)]
    return {"tokens_per_expert": per_expert, "tokens_per_rank": per_rank,
            "expert_imbalance": imbalance(per_expert), "rank_imbalance": imbalance(per_rank)}


def eplb_placement(load, world, slots):
    """EPLB's idea on one level: spend the world * slots - E spare slots on replicas of the experts with the
    largest load per replica, then place the replicas, heaviest first, on the least-loaded rank that has a
    free slot (and no replica of that expert yet, when one is left). Returns a list per rank of expert ids."""
    experts = len(load)
    replicas = [1] * experts
    for _ in range(world * slots - experts):
        hot = max(range(experts), key=lambda e: (load[e] / replicas[e], -e))
        replicas[hot] += 1
    items = sorted(((load[e] / replicas[e], e) for e in range(experts) for _ in range(replicas[e])),
                   key=lambda item: (-item[0], item[1]))
    placement, rank_load = [[] for _ in range(world)], [0.0] * world
    for share, e in items:
        free = [r for r in range(world) if len(placement[r]) < slots]
        fresh = [r for r in free if e not in placement[r]] or free
        r = min(fresh, key=lambda r: (rank_load[r], r))
        placement[r].append(e)
        rank_load[r] += share
    return placement


def _exchange(rows, send_counts):
    """all_to_all of a variable number of rows per destination: the counts first, then the rows."""
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    received = rows.new_empty((int(recv_counts.sum()), *rows.shape[1:]))
    dist.all_to_all_single(received, rows.contiguous(), recv_counts.tolist(), send_counts.tolist())
    return received, recv_counts


def ep_moe(x, logits, experts, placement, top_k, capacity):
    """Expert-parallel MoE on this rank. x (T, d), logits (T, E): this rank's tokens; placement[r]: the logical
    experts rank r holds, one per slot (the same list on every rank; an expert may have replicas);
    experts[i]: this rank's module for slot i. Each kept assignment goes to one replica of its expert (the
    i-th of this rank's assignments to e goes to replica (i + rank) % replicas). Returns {"out": (T, d),
    "dropped": assignments past capacity on this rank, "load": rows each local slot processed}."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n_experts = logits.shape[-1]
    expert, gate = route(logits, top_k)
    kept = keep_within_capacity(expert, capacity, n_experts)
    dropped = int((~kept).sum())
    token, choice = kept.nonzero(as_tuple=True)              # row-major: token order, then choice
    chosen, weight = expert[token, choice], gate[token, choice]
    # the replica of each assignment: (destination rank, slot there)
    replicas = [[(r, s) for r, row in enumerate(placement) for s, e in enumerate(row) if e == want]
                for want in range(n_experts)]
    seen = [0] * n_experts
    dest, slot = [], []
    for e in chosen.tolist():
        r, s = replicas[e][(seen[e] + rank) % len(replicas[e])]
        seen[e] += 1
        dest.append(r)
        slot.append(s)
    dest = torch.tensor(dest, dtype=torch.long, device=x.device)
    slot = torch.tensor(slot, dtype=torch.long, device=x.device)
    order = torch.argsort(dest, stable=True)                  # sort-based dispatch: one block per rank
    token, weight, dest, slot = token[order], weight[order], dest[order], slot[order]
    send_counts = torch.bincount(dest, minlength=world)
    inputs, recv_counts = _exchange(x[token], send_counts)
    local_slot, _ = _exchange(slot, send_counts)
    outputs = torch.empty_like(inputs)
    load = []
    for i, module in enumerate(experts):
        rows = (local_slot == i).nonzero(as_tuple=True)[0]
        load.append(len(rows))
        if len(rows):
            outputs[rows] = module(inputs[rows])
    # combine: every row goes back to the rank it came from, in the order it was sent
    returned = inputs.new_empty((int(send_counts.sum()), inputs.shape[1]))
    dist.all_to_all_single(returned, outputs, send_counts.tolist(), recv_counts.tolist())
    out = torch.zeros_like(x).index_add_(0, token, weight[:, None] * returned)
    return {"out": out, "dropped": dropped, "load": load}
