"""Per-class capacity: the highest interactive arrival rate at which >= 99 % of interactive requests meet the
SLO (TTFT <= 400 ms, TPOT <= 60 ms) while batch floods the gateway at 12/s from 0.6 s before. Serve gateway.py
as the judge does, sweep upward in steps of at most 5 % until the goodput fraction falls under 99 %, and write
capacity.json with interactive_capacity_requests_per_s.

    python sweep.py
"""
from __future__ import annotations


def main() -> None:
    raise NotImplementedError("sweep.py: sweep interactive rates beside a batch flood and write capacity.json")


if __name__ == "__main__":
    main()
