"""The project's one command: python run.py --out raw

Writes, under --out:
  reference.json   the reference run, summarised per layer (shape, sum, largest |value|)
  comparison.json  the harness on a clean stand-in device (the port's baseline: every layer within tolerance)
  ops.json         the operator-compatibility list from the exported graph
  trace.json       a torch.profiler trace of the reference run (where the CPU time goes)
  failure.json     a case where precision breaks (your choice: FAILURE below)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from harness import compare
from infracourse.kit.porting import Perturbation, device_run
from ops import compatibility_list
from reference import capture

SEED = 0
# TODO: a configuration of the stand-in device where precision breaks, e.g.
#   {"dtype": "float32", "mode": "chained", "perturb": {"layers": [...], "kind": ..., "scale": ..., "seed": 0}}
FAILURE: dict | None = None


def write(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="raw")
    parser.add_argument("--batch", type=int, default=2, help="2 on a CPU; larger where a device is")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)

    reference = capture({}, SEED, args.batch)
    write(out / "reference.json", {"model": {}, "seed": SEED, "batch": args.batch, "layers": {
        name: {"shape": list(t.shape), "sum": t.double().sum().item(), "abs_max": t.abs().max().item()}
        for name, t in reference.items()}})

    clean = device_run({}, SEED, args.batch, dtype="float32", mode="isolated")
    write(out / "comparison.json", {"device": "stand-in (float64 rounded to float32)", **compare(reference, clean)})

    write(out / "ops.json", {"model": {}, "batch": args.batch, "ops": compatibility_list({}, args.batch)})

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        capture({}, SEED, args.batch)
    prof.export_chrome_trace(str(out / "trace.json"))

    if FAILURE is None:
        raise NotImplementedError("choose your failure case: set FAILURE in run.py (README: 'run.py')")
    failure = {"model": {}, "seed": SEED, "batch": args.batch, **FAILURE}
    broken = device_run({}, SEED, args.batch, dtype=failure["dtype"], mode=failure["mode"],
                        perturb=Perturbation(**{**failure["perturb"], "layers": tuple(failure["perturb"]["layers"])}))
    write(out / "failure.json", {"config": failure, "result": compare(reference, broken)})
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}/")


if __name__ == "__main__":
    main()
