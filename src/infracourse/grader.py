"""The front door for grader authors: everything a grader in graders/ imports from the engine comes from here.

    from infracourse.grader import LabCheckFailed, assert_close, in_worker, run_watched, timed

The fixtures (`learner`, `record`, `device`, `ceilings`, `seed`, `lab_check`) come from the grading plugin;
this module holds what a grader calls. By job:

- words: `LabCheckFailed` (a check failed; the message teaches), `WrongOutput` (a timed call computed the wrong
  thing: not retried, no busy-machine note), `blocked("why")` (this machine cannot run the check: not a failure)
- learner calls: objects of the `learner` fixture are proxies; calling one runs the learner's code in the
  sandboxed worker and raises `LearnerRaised` / `LearnerHung` for what it did. `in_worker(kit.fn, *args)` names a
  course object to build inside the worker (a `BuildInWorker`; `learner.build(kit.fn, *args)` builds it),
  `run_watched` judges a kernel call from what the worker observed (`CallRecord`), `require_*` are the judge's
  other verdicts
- inputs: `tensors`, `scaled`, `tokens`, `gpt_batches` (specs both sides build alike), `build_inputs`,
  `fenced`, `dtype_name`
- comparison: `assert_close`, `assert_grad_close`, `relative_error`, `wrong_blocks`, `tolerance`
- timing: `timed` (a learner call, clocked by the judge), `reference_time` (a library op, here),
  `require_fraction`, `require_speedup`, `require_possible`
- figures: `read_figures` (a report's figures block), `read_json_figure` (a number the learner's run wrote),
  `figures_agree` (a learner's figure against the grader's re-measure, load-aware), `check_formula`, `check_measured`
- processes: `run_script`, `run_ranks` / `start_ranks` / `collect` / `rank_processes` / `RanksRun` (a torchrun
  world), `serving` (a learner's server), `server_environment`, `launch` (start a confined process: the one door
  every process of learner code goes through), `output` (bounded capture of a process's output)

docs/authoring.md walks through a grader written against it; tests/test_grader_imports.py keeps graders to it.
"""
from __future__ import annotations

from infracourse.compare import assert_close, assert_grad_close, relative_error, tolerance, wrong_blocks
from infracourse.failures import LabCheckFailed, WrongOutput
from infracourse import launch
from infracourse.grading import serving
from infracourse.grading.confined import run_script
from infracourse.grading.estimate import check_formula, check_measured
from infracourse.grading.fixtures import in_worker
from infracourse.grading.inputs import build as build_inputs
from infracourse.grading.inputs import dtype_name, gpt_batches, scaled, tensors, tokens
from infracourse.grading.perf import reference_time, require_fraction, require_speedup, timed
from infracourse.grading.plugin import blocked
from infracourse.grading.protocol import BuildInWorker
from infracourse.grading.provenance import require_clean_sources, require_own_implementation
from infracourse.grading.remote import LearnerHung, LearnerRaised
from infracourse.grading.report_check import figures_agree, read_figures, read_json_figure
from infracourse.grading.torchrun import RanksRun, collect, rank_processes, run_ranks, start_ranks
from infracourse.launch import output
from infracourse.hardware import cpu_contention
from infracourse.grading.verdicts import (explain_nan, fenced, interpreter_note, require_data_flow,
                                          require_own_kernel, require_plain_tensor, require_possible, run_watched)
from infracourse.observe import CallRecord

def server_environment(scratch, device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `serving.serve` starts a learner's server with, for a grader that starts the learner's own
    deploy command instead (week 20)."""
    return serving.environment(scratch, device, extra)


__all__ = [
    # words
    "LabCheckFailed", "WrongOutput", "blocked",
    # learner calls
    "LearnerRaised", "LearnerHung", "in_worker", "BuildInWorker", "CallRecord", "run_watched", "explain_nan",
    "require_plain_tensor", "require_data_flow", "require_own_kernel", "require_clean_sources", "require_own_implementation", "interpreter_note",
    # inputs
    "tensors", "scaled", "tokens", "gpt_batches", "build_inputs", "fenced", "dtype_name",
    # comparison
    "assert_close", "assert_grad_close", "relative_error", "wrong_blocks", "tolerance",
    # timing
    "timed", "reference_time", "require_fraction", "require_speedup", "require_possible", "cpu_contention",
    # figures
    "read_figures", "read_json_figure", "figures_agree", "check_formula", "check_measured",
    # processes
    "run_script", "run_ranks", "start_ranks", "collect", "rank_processes", "RanksRun", "serving", "output", "launch",
    "server_environment",
]
