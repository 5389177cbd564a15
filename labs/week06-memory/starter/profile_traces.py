"""Week 6, part 4: profiles of train_step at two sequence lengths and in two precisions, as trace files.

    python profile_traces.py        writes traces/step-T{32,128}-{fp32,bf16}.json.gz

Each is one step of step.train_step, after one warm-up step, on the kit GPT with d_model 128 and 2 layers,
a batch of 8 synthetic sequences (seed 0), AdamW at lr 1e-3; bf16 runs the step under torch.autocast.
"""
from pathlib import Path

LENGTHS, PRECISIONS = (32, 128), ("fp32", "bf16")


def trace(seq_len: int, precision: str, path: Path, device: str = "cpu") -> None:
    # TODO(week06): build the model, optimizer and batch as the docstring says, run one warm-up train_step,
    # then one step under torch.profiler.profile(record_shapes=True) (and torch.autocast for bf16), and
    # prof.export_chrome_trace(str(path)).
    raise NotImplementedError("trace(): profile one step and export it with export_chrome_trace")


if __name__ == "__main__":
    folder = Path(__file__).resolve().parent / "traces"
    folder.mkdir(exist_ok=True)
    for seq_len in LENGTHS:
        for precision in PRECISIONS:
            trace(seq_len, precision, folder / f"step-T{seq_len}-{precision}.json.gz")
