"""Measure the three techniques of the week against their baselines and print the report's figures.

    python measure.py        # three tables, then the ```yaml figures lines

1. int8 weights: state_dict bytes, eval loss and top-1 agreement with the fp32 target on the fixed eval
   tokens (infracourse.kit.quant_eval), and the time of a forward pass over them.
2. speculation: kit.speculative's target and 1-layer draft, k = 4, 32 new tokens, 16-token prompts; for
   batch 1, 2, 4, 8: acceptance rate, time per output token of speculative_generate and of the target alone
   (kit batched_greedy), and their ratio. Fastest of three alternated calls, one intra-op thread, fp32.
3. overload: your Engine, arrivals per step at 6x its capacity (one every step, 6 tokens each), with
   admission control (max_queue 4) and without it (a queue as long as the run); per request TTFT and E2EL
   in steps and ms (the step clock is the measured median step), P50/P95/P99, rejected fraction, goodput
   (admitted requests finishing within 30 steps of arrival, per step) and output tokens per second.
"""
import statistics
import time

import numpy as np
import torch

from engine import Engine
from infracourse.kit import quant_eval
from infracourse.kit.block_pool import BlockPool
from infracourse.kit.generate import seeded_prompts
from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.speculative import batched_greedy, draft_model, target_model
from quant import quantize_model
from speculative import speculative_generate

K, NEW = 4, 32


def fastest_pair(a, b, repeats=3):
    best = [float("inf")] * 2
    for _ in range(repeats):
        for i, fn in enumerate((a, b)):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


@torch.no_grad()
def quantisation(target):
    qmodel = quantize_model(target)
    tokens = quant_eval.eval_tokens()
    full, quant = target(tokens), qmodel(tokens)
    loss32, _ = quant_eval.loss_and_agreement(full, full, tokens)
    loss8, agree = quant_eval.loss_and_agreement(quant, full, tokens)
    b32 = quant_eval.unique_bytes(quant_eval.state_tensors(target).values())
    b8 = quant_eval.unique_bytes(quant_eval.state_tensors(qmodel).values())
    t8, t32 = fastest_pair(lambda: qmodel(tokens), lambda: target(tokens))
    print(f"fp32: {b32} B, loss {loss32:.4f}, forward {t32 * 1e3:.2f} ms | int8: {b8} B ({b32 / b8:.2f}x smaller), "
          f"loss {loss8:.4f} ({loss8 - loss32:+.5f}), agreement {agree:.3f}, forward {t8 * 1e3:.2f} ms")
    return {"fp32_weight_bytes": b32, "int8_weight_bytes": b8, "loss_change": round(loss8 - loss32, 5),
            "greedy_agreement": round(agree, 4)}


def speculation(target, draft):
    print(f"{'batch':>5} {'accept':>6} {'spec ms/tok':>11} {'plain ms/tok':>12} {'speed-up':>8}")
    speedups = {}
    for batch in (1, 2, 4, 8):
        prompts = seeded_prompts(batch, 256, 16, 16, seed=batch)
        _, stats = speculative_generate(target, draft, prompts, K, NEW)
        t_spec, t_plain = fastest_pair(lambda: speculative_generate(target, draft, prompts, K, NEW),
                                       lambda: batched_greedy(target, prompts, NEW))
        speedups[batch] = t_plain / t_spec
        print(f"{batch:>5} {stats['acceptance_rate']:>6.2f} {t_spec / NEW / batch * 1e3:>11.3f} "
              f"{t_plain / NEW / batch * 1e3:>12.3f} {speedups[batch]:>7.2f}x")
    stop = next((b for b, s in speedups.items() if s < 1), 16)
    return {"speedup_batch1": round(speedups[1], 2), "stops_helping_batch": stop}


def overload(max_queue, arrivals=60, tokens=6, slo_steps=30):
    model = GPT(GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_head=2, n_layer=2), seed=0)
    engine = Engine(model, BlockPool(48, 4), max_queue=max_queue)
    arrival, first, last, rejected, step_s = {}, {}, {}, 0, []
    prompts = seeded_prompts(arrivals, 256, 3, 8, seed=1)
    i = 0
    # until every admitted request has ended: its first token is not its last (its blocks are held till then)
    while i < arrivals or any(engine.status(r) in ("queued", "running") for r in arrival):
        if i < arrivals:
            rid = engine.submit(prompts[i], tokens)
            if rid is None:
                rejected += 1
            else:
                arrival[rid] = i
        t0 = time.perf_counter()
        for rid, _ in engine.step():
            first.setdefault(rid, i)
            last[rid] = i
        step_s.append(time.perf_counter() - t0)
        i += 1
    step_ms = statistics.median(step_s) * 1e3
    ttft = [first[r] - arrival[r] + 1 for r in arrival]
    e2el = [last[r] - arrival[r] + 1 for r in arrival]
    p50, p95, p99 = np.percentile(e2el, [50, 95, 99])
    good = sum(e <= slo_steps for e in e2el)
    print(f"max_queue {max_queue:>3}: rejected {rejected / arrivals:.2f}, TTFT P99 {np.percentile(ttft, 99):.0f} steps, "
          f"E2EL P50/P95/P99 {p50:.0f}/{p95:.0f}/{p99:.0f} steps ({p99 * step_ms:.1f} ms P99), TPOT 1 step "
          f"({step_ms:.2f} ms), goodput {good / i:.3f} req/step, {len(e2el) * tokens / (i * step_ms / 1e3):.0f} tok/s")


def main():
    torch.set_num_threads(1)
    target, draft = target_model(0), draft_model(0)
    figures = quantisation(target)
    figures.update(speculation(target, draft))
    overload(max_queue=4)
    overload(max_queue=60)  # no admission control: the queue holds every arrival
    print("```yaml figures\n" + "\n".join(f"{k}: {v}" for k, v in figures.items()) + "\n```")


if __name__ == "__main__":
    main()
