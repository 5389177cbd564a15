"""Pipeline parallelism: GPipe and 1F1B schedules, their bubble, and a 2-stage runner over send/recv.

A schedule is a list of time steps; each time step lists what the stages do in it, as (stage, microbatch,
'F' or 'B'). A forward and a backward each take one time step, and a stage does one thing at a time.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def bubble_fraction(stages, microbatches):
    """Idle share of each stage's time: p - 1 time steps of filling and p - 1 of draining, out of m + p - 1
    (forward and backward alike)."""
    return (stages - 1) / (microbatches + stages - 1)


def _run(orders):
    """Time steps from each stage's ordered actions: a stage runs its next action as soon as what it needs
    (the previous stage's forward, the next stage's backward) finished in an earlier time step."""
    stages, done, schedule = len(orders), set(), []
    position = [0] * stages
    while any(position[s] < len(orders[s]) for s in range(stages)):
        step = []
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            m, kind = orders[s][position[s]]
            if kind == "F":
                ready = s == 0 or (s - 1, m, "F") in done
            else:
                ready = (s, m, "F") in done and (s == stages - 1 or (s + 1, m, "B") in done)
            if ready:
                step.append((s, m, kind))
        for action in step:
            position[action[0]] += 1
        done.update(step)
        schedule.append(step)
    return schedule


def gpipe_schedule(stages, microbatches):
    """GPipe: every microbatch forward through the pipeline, then every backward."""
    order = [(m, "F") for m in range(microbatches)] + [(m, "B") for m in range(microbatches)]
    return _run([order] * stages)


def one_f_one_b_schedule(stages, microbatches):
    """1F1B: stage s runs p - s - 1 warm-up forwards, then alternates one forward and one backward, then drains
    its backwards; it never holds more than p - s microbatches' activations."""
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order = [(m, "F") for m in range(warmup)]
        for m in range(microbatches - warmup):
            order += [(warmup + m, "F"), (m, "B")]
        order += [(m, "B") for m in range(microbatches - warmup, microbatches)]
        orders.append(order)
    return _run(orders)


def two_stage_step(weight, bias, data, microbatches):
    """One training step of a 2-stage pipeline, GPipe order. Rank 0 holds stage 0, h = tanh(x @ w.T + b), and
    `data` is the inputs x; rank 1 holds stage 1, out = h @ w.T + b, and `data` is the targets. The loss is
    the mean squared error over the whole batch. Leaves each stage's gradients in weight.grad and bias.grad;
    returns the loss on rank 1 and None on rank 0."""
    chunks = data.chunk(microbatches)
    if dist.get_rank() == 0:
        kept, sends = [], []
        for x in chunks:                                   # forwards: activations go downstream
            h = torch.tanh(x @ weight.T + bias)
            sends.append(dist.isend(h.detach().contiguous(), dst=1))
            kept.append(h)
        for h in kept:                                     # backwards: gradients come back
            grad = torch.empty_like(h)
            dist.recv(grad, src=1)
            h.backward(grad)
        for work in sends:
            work.wait()
        return None
    total = torch.zeros((), dtype=data.dtype, device=data.device)
    for target in chunks:
        h = torch.empty(target.shape[0], weight.shape[1], dtype=weight.dtype, device=weight.device)
        dist.recv(h, src=0)
        h.requires_grad_()
        # the whole batch's mean is the mean of the microbatches' means: each is scaled by 1/m
        loss = F.mse_loss(h @ weight.T + bias, target) / microbatches
        loss.backward()
        dist.send(h.grad.contiguous(), dst=0)
        total += loss.detach()
    return total
