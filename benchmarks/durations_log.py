"""A pytest plugin that appends each test's outcome and duration to a file as soon as the test ends, so a run cut
off by a time limit still says where its time went (pytest's --durations prints only at the end).

    python -m pytest -p benchmarks.durations_log --durations-log=/tmp/d.tsv -n 3 ...
    sort -t$'\t' -k3 -rn /tmp/d.tsv | head      # nodeid, outcome, seconds (call + setup + teardown)
"""
from __future__ import annotations

import time


def pytest_addoption(parser):
    parser.addoption("--durations-log", default=None, help="append 'nodeid<TAB>outcome<TAB>seconds' per test here")


_totals: dict[str, list] = {}


def pytest_runtest_logreport(report):
    entry = _totals.setdefault(report.nodeid, [0.0, "passed"])
    entry[0] += report.duration
    if report.outcome != "passed":
        entry[1] = report.outcome
    if report.when == "teardown" and _PATH:
        with open(_PATH, "a") as f:
            f.write(f"{report.nodeid}\t{entry[1]}\t{entry[0]:.2f}\t{time.time():.0f}\n")


_PATH = None


def pytest_configure(config):
    global _PATH
    # under xdist the controller receives every worker's reports: write there only, once per test
    _PATH = None if hasattr(config, "workerinput") else config.getoption("durations_log")
