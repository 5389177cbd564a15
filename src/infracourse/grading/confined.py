"""Programs the judge runs from the learner's files, confined like the grading worker.

Some checks are about a program rather than a function: "your experiment reproduces from a clean checkout",
"training resumes after a SIGKILL". The judge starts those programs itself, in the sandbox (the learner's
snapshot read-only, a scratch folder read-write, no network), with the worker's clean environment and a
session of their own so the whole tree can be killed; what they write is untrusted data the judge re-derives.
Where no sandbox can be made on the machine the program runs plain, with the same environment (the runner
has already said so in the grade). Starting it is infracourse.launch's job, as for every confined process.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from infracourse import launch
from infracourse.launch import output


@dataclass
class ScriptRun:
    command: str  # as the learner would type it
    returncode: int | None  # None: killed at the time limit (or at the output limit: output_cut)
    output: str  # the end of its stdout and stderr together (output.TAIL_BYTES at most)
    wall_s: float
    output_cut: bool = False  # it printed past output.OUTPUT_LIMIT and was killed

    def failure(self, limit_s: float) -> str | None:
        """None when the program ran to a clean exit; otherwise what happened, with the end of its output."""
        if self.returncode == 0 and not self.output_cut:
            return None
        tail = output.last_lines(self.output, 12)
        what = (f"printed too much; {output.CUT_NOTE}" if self.output_cut
                else f"did not finish within {limit_s:.0f} s" if self.returncode is None
                else f"exited with status {self.returncode}")
        return f"`{self.command}` {what}" + (f"; the end of its output:\n{tail}" if tail else " and printed nothing")


def run_script(snapshot: Path, script: str, args: list[str], *, scratch: Path, gpu: bool = False,
               timeout_s: float = 120) -> ScriptRun:
    """Run `python SCRIPT ARGS` from the learner's snapshot (only the files they submitted), in the empty
    scratch folder: the clean checkout a reader of their report would start from."""
    snapshot, scratch = Path(snapshot).resolve(), Path(scratch)
    started = time.perf_counter()
    # beside the scratch, not in it: the script cannot see or replace its own log; cut past output.OUTPUT_LIMIT
    proc = launch.start([sys.executable, "-s", str(snapshot / script), *args], scratch=scratch, snapshot=snapshot,
                        gpu=gpu, log=scratch.parent / f"{scratch.name}.script.log")
    code = proc.finish(timeout_s)
    return ScriptRun(" ".join(["python", script, *args]), code, proc.tail(), time.perf_counter() - started, proc.cut)
