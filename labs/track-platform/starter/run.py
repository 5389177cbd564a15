"""The project's one run command: serve the course service alone (one FIFO: the baseline) and behind gateway.py
(two classes), drive both with the same load (24 batch requests at once, 0.3 s later 8 interactive at 3/s),
then a failure case. Writes raw/baseline.json and raw/isolated.json (the interactive records,
kit.loadgen.write_records), raw/profile.json (where request time goes: {"rows": [{"name", "total_ms"}, ...]})
and raw/failure.json.

    python run.py --out raw
"""
from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="raw")
    parser.parse_args()
    raise NotImplementedError("run.py: the baseline, the same load through your gateway, the profile table and the "
                              "failure case (see the handout)")


if __name__ == "__main__":
    main()
