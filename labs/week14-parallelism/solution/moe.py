"""Expert parallelism: a top-k mixture-of-experts layer whose experts are spread over the ranks, tokens sent to
them and their outputs brought back with all_to_all (dispatch and combine)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def route(x, router, top_k):
    """(tokens, top_k) expert ids and gates: softmax over the experts, the k best, renormalised to sum to 1."""
    gate, expert = torch.softmax(x @ router, dim=-1).topk(top_k, dim=-1)
    return expert, gate / gate.sum(-1, keepdim=True)


def _exchange(rows, send_counts):
    """all_to_all of variable-length rows: first the counts, then the rows themselves."""
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    received = rows.new_empty((int(recv_counts.sum()), *rows.shape[1:]))
    dist.all_to_all_single(received, rows.contiguous(), recv_counts.tolist(), send_counts.tolist())
    return received, recv_counts


def moe_layer(x, router, experts, top_k, capacity):
    """x (tokens, d): this rank's tokens. router (d, E): the same on every rank. experts: the E / world experts
    this rank holds, experts[i] being global expert rank * E / world + i. A rank sends each expert at most
    `capacity` of its tokens, the first in token order; the rest of that expert's assignments are dropped.
    Returns (this rank's output (tokens, d), how many of its assignments were dropped)."""
    world, tokens = dist.get_world_size(), x.shape[0]
    n_experts, per_rank = router.shape[1], len(experts)
    expert, gate = route(x, router, top_k)
    expert, gate = expert.reshape(-1), gate.reshape(-1)          # assignment i is token i // top_k
    token = torch.arange(tokens, device=x.device).repeat_interleave(top_k)
    # each assignment's place in its expert's queue, in token order; past capacity it is dropped
    place = (F.one_hot(expert, n_experts).cumsum(0) * F.one_hot(expert, n_experts)).sum(1) - 1
    keep = place < capacity
    dropped = int((~keep).sum())
    expert, gate, token = expert[keep], gate[keep], token[keep]
    # dispatch: group the kept assignments by the rank that holds their expert
    order = torch.argsort(expert // per_rank, stable=True)
    expert, gate, token = expert[order], gate[order], token[order]
    send_counts = torch.bincount(expert // per_rank, minlength=world)
    inputs, recv_counts = _exchange(x[token], send_counts)
    local_ids, _ = _exchange(expert % per_rank, send_counts)
    # each local expert runs once, on every row sent to it
    outputs = torch.empty_like(inputs)
    for i, module in enumerate(experts):
        rows = local_ids == i
        if rows.any():
            outputs[rows] = module(inputs[rows])
    # combine: the results go back where they came from, weighted by their gate, summed per token
    returned = inputs.new_empty((int(send_counts.sum()), inputs.shape[1]))
    dist.all_to_all_single(returned, outputs, send_counts.tolist(), recv_counts.tolist())
    out = torch.zeros_like(x).index_add_(0, token, gate[:, None] * returned)
    return out, dropped
