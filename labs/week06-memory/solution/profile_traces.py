"""Week 6, part 4: profiles of train_step at two sequence lengths and in two precisions, as trace files.

    python profile_traces.py        writes traces/step-T{32,128}-{fp32,bf16}.json.gz

Each is one step of step.train_step, after one warm-up step, on the kit GPT with d_model 128 and 2 layers,
a batch of 8 synthetic sequences (seed 0), AdamW at lr 1e-3; bf16 runs the step under torch.autocast.
Open one in https://ui.perfetto.dev or chrome://tracing; the grader reads them back.
"""
import dataclasses
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch
from step import train_step

LENGTHS, PRECISIONS = (32, 128), ("fp32", "bf16")


def trace(seq_len: int, precision: str, path: Path, device: str = "cpu") -> None:
    cfg = dataclasses.replace(GPTConfig(d_model=128, n_layer=2), seq_len=seq_len)
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = synthetic_batch(cfg, 8, seed=0, device=device)
    metrics = {}
    autocast = dict(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autocast(**autocast):
        train_step(model, optimizer, inputs, targets, metrics)  # warm-up: Adam's states appear on step 1
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        with torch.autocast(**autocast):
            train_step(model, optimizer, inputs, targets, metrics)
    prof.export_chrome_trace(str(path))  # a .gz name: written compressed


if __name__ == "__main__":
    folder = Path(__file__).resolve().parent / "traces"
    folder.mkdir(exist_ok=True)
    for seq_len in LENGTHS:
        for precision in PRECISIONS:
            out = folder / f"step-T{seq_len}-{precision}.json.gz"
            trace(seq_len, precision, out)
            print(f"wrote {out}")
