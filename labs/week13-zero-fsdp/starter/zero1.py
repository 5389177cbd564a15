"""ZeRO stage 1 by hand: every rank keeps AdamW's moments for its own shard of the parameters."""
from __future__ import annotations

import torch
import torch.distributed as dist


class Zero1AdamW:
    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        # TODO: which shard is this rank's (dist.get_rank(), dist.get_world_size()); its exp_avg and exp_avg_sq

    @torch.no_grad()
    def step(self) -> None:
        # TODO: average the gradients over ranks, AdamW on this rank's shard, then every rank gets every shard
        raise NotImplementedError("TODO: write Zero1AdamW.step")

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
