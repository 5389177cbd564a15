"""ZeRO stage 1 by hand: every rank keeps AdamW's moments for its own slice of the flattened parameters."""
from __future__ import annotations

import torch
import torch.distributed as dist


class Zero1AdamW:
    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard = -(-self.numel // self.world)  # ceil: the flat buffer is padded so every shard is equal
        self.start = self.rank * self.shard
        device = self.params[0].device
        self.exp_avg = torch.zeros(self.shard, device=device)
        self.exp_avg_sq = torch.zeros(self.shard, device=device)
        self.steps = 0

    def _flat(self, tensors) -> torch.Tensor:
        """A temporary padded flat copy (nothing full-size is kept between steps)."""
        flat = torch.zeros(self.shard * self.world, device=self.exp_avg.device)
        flat[: self.numel] = torch.cat([t.reshape(-1) for t in tensors])
        return flat

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        grads = self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        dist.all_reduce(grads)  # every rank's gradient summed; averaged below: the global batch's mean loss
        grads /= self.world
        flat = self._flat(self.params)
        mine, g = flat[self.start: self.start + self.shard], grads[self.start: self.start + self.shard]
        beta1, beta2 = self.betas
        mine.mul_(1 - self.lr * self.weight_decay)  # AdamW: decoupled weight decay
        self.exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bias1, bias2 = 1 - beta1 ** self.steps, 1 - beta2 ** self.steps
        denom = (self.exp_avg_sq.sqrt() / bias2 ** 0.5).add_(self.eps)
        mine.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)
        dist.all_gather_into_tensor(flat, mine.clone())  # every rank gets every updated shard
        offset = 0
        for p in self.params:
            p.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
