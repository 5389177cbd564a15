"""Every grade, not most: run a selection of the lab proofs (tests/test_weekNN.py: a known-wrong variant fails its
check, an honest solution passes) N times, K runs at once, and count each test's outcomes (issue 29: "fails on the
check meant to catch it in 10 of 10 consecutive grades on a loaded 2-core machine").

    python benchmarks/repeat_proofs.py tests/test_week17.py -k "preempt" --times 10 --parallel 3
    python benchmarks/repeat_proofs.py tests/test_week11.py tests/test_week12.py -m variant --times 10

K runs at once are the load: on 2 cores, 3 whole-week grades at a time leave each far less than a core, the
condition under which a verdict that depends on timing or on a seed shows itself. Each run is a plain
`python -m pytest` of the selection (its own tmp folders), its outcomes read from a JUnit XML file.

On a bigger host, `--pin 2 --workers 3` makes each of the K slots a loaded 2-core machine of its own: the slot's
pytest (and every process it starts) is bound to two cores and runs three tests at a time (pytest-xdist).
`--per-file` splits every run into one pytest per test file, so `--deadline` (stop starting new files after S
seconds) loses at most the files in flight, and `--out DIR` keeps each file's XML (run-R--FILE.xml): a later call
with `--out` on a copy of that folder runs only what is missing, and `--summarise DIR [DIR ...]` counts the XMLs
of several calls (the lent GPU machine's 16 cores, ten-minute calls):

    CUDA_VISIBLE_DEVICES= python benchmarks/repeat_proofs.py --times 10 --parallel 8 --pin 2 --workers 3 \
        --per-file --deadline 480 --out $OUT/xml -m "variant or slow" tests/test_week1[1-4].py

Prints one line per test (passed/failed/skipped counts over the runs, and the first failure's message when not
every run passed), then the totals and the wall time. Exit 0: every selected test passed in every run; 1: some
test did not, or some run is missing (deadline); 2: bad arguments or a run that produced no results.
"""
from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def split_selection(selection: list[str]) -> tuple[list[str], list[str]]:
    """(test files, the other pytest arguments) of a selection: `--per-file` runs each file with the others."""
    files = [a for a in selection if not a.startswith("-") and a.split("::")[0].endswith(".py")]
    options = [a for a in selection if a not in files]
    return files, options


def xml_name(run: int, target: str | None) -> str:
    return f"run-{run}.xml" if target is None else f"run-{run}--{Path(target.split('::')[0]).stem}.xml"


def run_once(xml: Path, arguments: list[str], base: Path, *, cores: list[int] | None = None,
             workers: int = 0) -> Path:
    """One pytest run; returns its JUnit XML path (absent if pytest wrote none). `cores`: bind it (and every
    process it starts) to those CPUs; `workers`: that many tests at a time (pytest-xdist)."""
    spread = ["-n", str(workers), "--dist", "loadgroup"] if workers else []
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                    f"--basetemp={base}", *spread, *arguments], cwd=REPO, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, preexec_fn=pin)
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


def summarise(xmls: list[Path], times: int) -> int:
    """Print each test's outcomes over the XMLs (each test is expected `times` times); 0 if every test passed
    (or was skipped) in every one of its `times` runs."""
    counts: dict[str, Counter] = defaultdict(Counter)
    first_failure: dict[str, str] = {}
    for xml in xmls:
        for test, (outcome, message) in outcomes(xml).items():
            counts[test][outcome] += 1
            if outcome in ("failed", "error"):
                first_failure.setdefault(test, message)
    every = all(c["passed"] + c["skipped"] == times and not (c["passed"] and c["skipped"])
                for c in counts.values())
    for test in sorted(counts):
        c = counts[test]
        shown = ", ".join(f"{n} {k}" for k, n in sorted(c.items()))
        print(f"{test}: {shown}" + (f"  first failure: {first_failure[test]}" if test in first_failure else ""))
    total = sum(counts.values(), Counter())
    short = sorted(t for t, c in counts.items() if sum(c.values()) < times)
    print(f"{len(counts)} tests, {times} runs expected each: " + ", ".join(f"{n} {k}" for k, n in sorted(total.items()))
          + (f"; {len(short)} tests ran fewer than {times} times" if short else ""))
    return 0 if every else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--times", type=int, default=10, help="runs of the selection (default 10)")
    parser.add_argument("--parallel", type=int, default=3, help="runs at once (default 3: the load)")
    parser.add_argument("--pin", type=int, default=0, metavar="N", help="bind each of the runs at once to N cores "
                        "of its own (a loaded N-core machine per slot on a bigger host)")
    parser.add_argument("--workers", type=int, default=0, help="tests at a time inside each run (pytest-xdist)")
    parser.add_argument("--per-file", action="store_true", help="one pytest per test file of each run")
    parser.add_argument("--deadline", type=float, default=0, metavar="S", help="start nothing new after S seconds")
    parser.add_argument("--out", type=Path, help="keep the XMLs here; those already there are not run again")
    parser.add_argument("--summarise", type=Path, nargs="+", metavar="DIR", help="only count the XMLs of these "
                        "folders (earlier --out), expecting --times runs of each test")
    args, selection = parser.parse_known_args(argv)
    if args.summarise:
        xmls = sorted(x for folder in args.summarise for x in folder.glob("run-*.xml"))
        if not xmls:
            print(f"no run-*.xml in {', '.join(map(str, args.summarise))}", file=sys.stderr)
            return 2
        return summarise(xmls, args.times)
    if args.times < 1 or args.parallel < 1 or not selection:
        parser.print_usage(sys.stderr)
        print("give a pytest selection (files, -k, -m) and --times/--parallel of at least 1", file=sys.stderr)
        return 2
    if args.pin and args.pin * args.parallel > len(os.sched_getaffinity(0)):
        print(f"--pin {args.pin} x --parallel {args.parallel} needs {args.pin * args.parallel} cores; this process "
              f"may use {len(os.sched_getaffinity(0))}", file=sys.stderr)
        return 2
    files, options = split_selection(selection)
    if args.per_file and not files:
        print("--per-file needs test files in the selection", file=sys.stderr)
        return 2
    # one pytest per file: the node ids of one file (tests/test_week13.py::test_x[...]) run together, and so
    # write one XML (a pytest per node id wrote them all to the same file name)
    by_file: dict[str, list[str]] = {}
    for selected in files:
        by_file.setdefault(selected.split("::")[0], []).append(selected)
    targets = list(by_file) if args.per_file else [None]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="repeat-proofs-") as scratch_name:
        out = args.out or Path(scratch_name)
        out.mkdir(parents=True, exist_ok=True)
        # Run-major order: the first runs of every file finish before any file's tenth starts.
        items = [(r, t) for r in range(args.times) for t in targets if not (out / xml_name(r, t)).exists()]
        slots: queue.Queue[int] = queue.Queue()
        for slot in range(args.parallel):
            slots.put(slot)
        late = threading.Event()

        def one(item):
            run, target = item
            if args.deadline and time.perf_counter() - start > args.deadline:
                late.set()
                return
            slot = slots.get()
            try:
                cores = sorted(os.sched_getaffinity(0))[slot * args.pin:(slot + 1) * args.pin] if args.pin else None
                arguments = selection if target is None else [*options, *by_file[target]]
                run_once(out / xml_name(run, target), arguments, Path(scratch_name) / f"tmp-{run}-{slot}",
                         cores=cores, workers=args.workers)
            finally:
                slots.put(slot)

        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(one, items))
        expected = [out / xml_name(r, t) for r in range(args.times) for t in targets]
        missing = [x.name for x in expected if not x.exists()]
        if missing and not late.is_set():
            print(f"{len(missing)} run(s) wrote no results ({', '.join(missing[:6])}): the selection did not "
                  "collect; run it once with plain pytest to see why", file=sys.stderr)
            return 2
        if missing:
            print(f"deadline: {len(missing)} of {len(expected)} runs not started; run again with the same --out",
                  file=sys.stderr)
        verdict = summarise([x for x in expected if x.exists()], args.times)
    print(f"{args.parallel} runs at once" + (f", each on {args.pin} cores" if args.pin else "")
          + (f", {args.workers} tests at a time in each" if args.workers else "")
          + f"; {time.perf_counter() - start:.0f} s wall")
    return 1 if missing else verdict


if __name__ == "__main__":
    sys.exit(main())
