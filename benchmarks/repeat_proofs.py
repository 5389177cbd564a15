"""Every grade, not most: run a selection of the lab proofs (tests/test_weekNN.py: a known-wrong variant fails its
check, an honest solution passes) N times, K runs at once, and count each test's outcomes (issue 29: "fails on the
check meant to catch it in 10 of 10 consecutive grades on a loaded 2-core machine").

    python benchmarks/repeat_proofs.py tests/test_week17.py -k "preempt" --times 10 --parallel 3
    python benchmarks/repeat_proofs.py tests/test_week11.py tests/test_week12.py -m variant --times 10

K runs at once are the load: on 2 cores, 3 whole-week grades at a time leave each far less than a core, the
condition under which a verdict that depends on timing or on a seed shows itself. Each run is a plain
`python -m pytest` of the selection (its own tmp folders), its outcomes read from a JUnit XML file.

Prints one line per test (passed/failed/skipped counts over the runs, and the first failure's message when not
every run passed), then the totals and the wall time. Exit 0: every selected test passed in every run; 1: some
test did not; 2: bad arguments or a run that produced no results.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_once(index: int, selection: list[str], scratch: Path) -> Path:
    """One pytest run of the selection; returns its JUnit XML path (absent if pytest wrote none)."""
    xml = scratch / f"run-{index}.xml"
    base = scratch / f"tmp-{index}"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                    f"--basetemp={base}", *selection], cwd=REPO, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return xml


def outcomes(xml: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, first line of the failure message) from one JUnit XML file."""
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (node.get("message") or "").splitlines()[0][:240] if node.get("message") else ""
                break
        found[test] = (outcome, message)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--times", type=int, default=10, help="runs of the selection (default 10)")
    parser.add_argument("--parallel", type=int, default=3, help="runs at once (default 3: the load)")
    args, selection = parser.parse_known_args(argv)
    if args.times < 1 or args.parallel < 1 or not selection:
        parser.print_usage(sys.stderr)
        print("give a pytest selection (files, -k, -m) and --times/--parallel of at least 1", file=sys.stderr)
        return 2
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="repeat-proofs-") as scratch_name:
        scratch = Path(scratch_name)
        with ThreadPoolExecutor(args.parallel) as pool:
            xmls = list(pool.map(lambda i: run_once(i, selection, scratch), range(args.times)))
        missing = [x.name for x in xmls if not x.exists()]
        if missing:
            print(f"{len(missing)} run(s) wrote no results ({', '.join(missing)}): the selection did not collect; "
                  "run it once with plain pytest to see why", file=sys.stderr)
            return 2
        counts: dict[str, Counter] = defaultdict(Counter)
        first_failure: dict[str, str] = {}
        for xml in xmls:
            for test, (outcome, message) in outcomes(xml).items():
                counts[test][outcome] += 1
                if outcome in ("failed", "error"):
                    first_failure.setdefault(test, message)
    every = all(c["passed"] + c["skipped"] == args.times and not (c["passed"] and c["skipped"])
                for c in counts.values())
    for test in sorted(counts):
        c = counts[test]
        shown = ", ".join(f"{n} {k}" for k, n in sorted(c.items()))
        print(f"{test}: {shown}" + (f"  first failure: {first_failure[test]}" if test in first_failure else ""))
    total = sum(counts.values(), Counter())
    print(f"{len(counts)} tests x {args.times} runs, {args.parallel} at once: "
          + ", ".join(f"{n} {k}" for k, n in sorted(total.items()))
          + f"; {time.perf_counter() - start:.0f} s wall")
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main())
