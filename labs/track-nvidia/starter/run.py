"""The project's one command: `python run.py --out raw`.

It measures, on this machine's device at kit.hotspot.project_size(device), the course GPT's training step with
its own norm (baseline) and with fused_norm.rms_norm, and writes raw/baseline.json, raw/optimised.json,
raw/failure.json and the bottleneck evidence (a Chrome trace of a baseline step). The handout lists the fields.
"""
import argparse
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="raw", help="folder for the raw data")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    # TODO: baseline (step time, one unfused norm's forward + backward, launches and copies, the share), a
    # torch.profiler trace of one step, the same with your norm, MFU, and a few shapes where yours may lose.
    raise NotImplementedError("run.py measures nothing yet: write the baseline first (see the handout)")


if __name__ == "__main__":
    main()
