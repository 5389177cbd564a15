"""The project's one run command: `python run.py --out raw` (CPU: 4 ranks over gloo; `--device cuda` for NCCL).

It must write, from your moe.py on the course's routing traces (infracourse.kit.moe.case):
  raw/baseline.json   dense layer time, routing statistics of the fixed skewed trace (kit.moe.FIXED_SEED), and
                      ep_moe with expert e on rank e // 2: token rows per rank, times
  raw/optimised.json  the same with your eplb_placement
  raw/profile.json    a profile table of one expert-parallel forward: {"rows": [{"name", "self_ms", ...}]}
  raw/failure.json    a capacity sweep on the skewed trace: {"trace", "seed", "world", "rows": [{"capacity_factor",
                      "capacity", "dropped", "drop_fraction", "relative_error"}]}
"""
import argparse
from pathlib import Path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="raw")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    raise NotImplementedError("run.py: start the ranks (torch.multiprocessing.spawn), run ep_moe on both "
                              "placements and the capacity sweep, and write the four raw files")


if __name__ == "__main__":
    main()
