"""`cohort regrade --slurm` against a real one-node Slurm the test starts (munged, slurmctld, slurmd as root,
a slurm.conf in tmp_path): results come back into the gradebook, a bad bundle is an error, a task that dies
costs only the submission it was grading, and a node without a sandbox refuses."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
from typer.testing import CliRunner

from infracourse.cli import app
from infracourse.cohort import synthetic
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.regrade import regrade
from infracourse.cohort.slurm import SlurmOptions, jobs_root

from cohort_support import members

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
pytestmark = [
    pytest.mark.skipif(not all(shutil.which(d) for d in DAEMONS),
                       reason="Slurm is not installed: `apt-get install slurm-wlm munge` (CI's .ci/run does)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="starting slurmd needs root"),
    pytest.mark.xdist_group("slurm"),  # under `pytest -n` (with --dist loadgroup) one worker runs them in turn
]

CONF = """ClusterName=infracoursetest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
SlurmctldPort={ctld}
SlurmdPort={slurmd}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster(tmp_path_factory, monkeypatch):
    """A one-node Slurm, stopped (every daemon) even when the test fails."""
    d = tmp_path_factory.mktemp("slurm")
    (d / "state").mkdir()
    (d / "spool").mkdir()
    (d / "munge.key").write_bytes(os.urandom(1024))
    (d / "munge.key").chmod(0o600)
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(d=d, ctld=_free_port(), slurmd=_free_port()))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    started = []
    logs = open(d / "daemons.out", "wb")
    try:
        started.append(subprocess.Popen(["munged", "--force", "--foreground", f"--key-file={d}/munge.key",
                                         f"--socket={d}/munge.sock", f"--pid-file={d}/munged.pid",
                                         f"--log-file={d}/munged.log", f"--seed-file={d}/munge.seed"],
                                        stdout=logs, stderr=logs))
        _wait(lambda: (d / "munge.sock").exists(), "munged", d)
        started.append(subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], stdout=logs, stderr=logs))
        started.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", "localhost"], stdout=logs,
                                        stderr=logs))
        _wait(lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True,
                                               text=True).stdout, "the node to be idle", d)
        yield d
    finally:
        subprocess.run(["scancel", "--user=root"], capture_output=True)
        for proc in reversed(started):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(started):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        logs.close()


def _wait(ready, what, folder, timeout=60):
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            logs = "\n".join(f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in folder.glob("*.log"))
            raise AssertionError(f"Slurm did not start ({what}):\n{logs}")
        time.sleep(0.2)


@pytest.fixture
def cohort(tmp_path, monkeypatch):
    course = synthetic.write_course(tmp_path / "course", weeks=1, kernel_weeks=())
    bundles = synthetic.write_cohort(course, tmp_path / "bundles", learners=4, missing=0)
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    assert book.import_bundles(bundles, course).committed
    monkeypatch.setenv("INFRACOURSE_COURSE", str(course.root))
    monkeypatch.chdir(tmp_path)
    return course, bundles, book


def test_regrade_as_a_job_array_fills_the_gradebook(cluster, cohort):
    course, bundles, book = cohort
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(book.path)) as db, db:  # one stored bundle gone bad: an error, not a stop
        db.execute("UPDATE submissions SET bundle = x'00' WHERE learner = 'learner003'")
    out = CliRunner().invoke(app, ["cohort", "regrade", "--slurm", "--tasks", "2", "--array-limit", "2",
                                   "--partition", "debug", "--time", "10"])
    assert out.exit_code == 0, out.output
    assert "regraded 4 submission(s)" in out.output and "1 submission(s) could not be graded" in out.output
    results = {sub.learner: book.results_of(sub.id, "verified") for sub in book.latest_submissions()}
    assert all(len(r) == 1 for r in results.values()), "each recorded once"
    for i, bundle in enumerate(bundles[:3]):
        verified = results[f"learner{i:03d}"][0][1]
        assert verified.sandboxed and verified.complete == (members(bundle)["files/answer.py"].decode()
                                                             == synthetic.SOLUTION)
    assert {c.status for c in results["learner003"][0][1].checks} == {"error"}
    assert "not a readable zip" in results["learner003"][0][1].checks[0].message
    assert not jobs_root(book).exists() or not any(jobs_root(book).iterdir()), "the job folder is removed"
    again = CliRunner().invoke(app, ["cohort", "regrade", "--slurm"])
    assert "regraded 0 submission(s)" in again.output, "verified already: nothing submitted"


def test_a_task_that_dies_costs_only_the_submission_it_was_grading(cluster, cohort):
    course, bundles, book = cohort
    notes, killed = [], []

    def kill_the_task_when_it_starts_grading():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            started = list(jobs_root(book).glob("*/started/*"))
            if started:
                job_id = next(jobs_root(book).glob("*/job_id")).read_text().strip()
                subprocess.run(["scancel", "--signal=KILL", "--full", job_id], check=True)
                killed.append(int(started[0].name))
                return
            time.sleep(0.05)

    threading.Thread(target=kill_the_task_when_it_starts_grading, daemon=True).start()
    done = regrade(book, course, slurm=SlurmOptions(tasks=1, poll_s=0.5), on_note=notes.append)
    assert len(killed) == 1 and [r.submission.id for r in done] == killed
    assert "its Slurm task 0 ended while grading it" in done[0].error
    assert len(notes) == 1 and "3 submission(s) not reached" in notes[0]
    rest = regrade(book, course, slurm=SlurmOptions(tasks=2, poll_s=0.5))
    assert len(rest) == 3 and not any(r.error for r in rest), "the next run grades the ones not reached"


def test_a_node_without_a_sandbox_refuses_like_the_instructors_machine(cluster, cohort):
    course, bundles, book = cohort
    notes = []
    options = SlurmOptions(tasks=1, poll_s=0.5, sbatch_args=["--export=ALL,INFRACOURSE_NO_SANDBOX=1"])
    assert regrade(book, course, slurm=options, on_note=notes.append) == []
    assert len(notes) == 1 and "4 submission(s) not reached" in notes[0] and "no sandbox" in notes[0], notes
    assert not any(book.results_of(s.id, "verified") for s in book.latest_submissions()), "nothing recorded"
