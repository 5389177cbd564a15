"""Measured figures are one typed model (grading.results.Figure): checked where they are made and wherever they
are read back, and stored as the same flat JSON object as before, so old grades, gradebooks and bundles load."""
import ast
import json
import math
import sqlite3
from contextlib import closing

import pytest
from judgechannel import Channel
from minicourse import make_course

from infracourse.cohort import synthetic
from infracourse.cohort.gradebook import Gradebook
from infracourse.grading.results import DETAIL_KEYS, CheckResult, Figure, FigureError, GradeResult
from infracourse.grading.runner import grade
from infracourse.progress import Progress

from cohort_support import members, rezip
from conftest import REPO

# What the `record` fixture wrote before Figure existed: {"value", "target", "unit", **extra}, extra as each
# grader passed it (week 9: label/flops/bytes/seconds/...; week 8: a Timing record; week 10: model and batch).
OLD_FIGURES = {
    "TFLOP/s at 4096^3 bf16": {"value": 601.5, "target": 555.2, "unit": "TFLOP/s", "ceiling": 694.0,
                               "fraction_of_ceiling": 0.8667, "label": "matmul 4096x4096x4096 bf16",
                               "flops": 137438953472, "bytes": 100663296, "seconds": 0.000228,
                               "reference_seconds": 0.000205, "reference": "torch.mm (cuBLAS)",
                               "peak_tflops": 694.0, "copy_gbps": 4244.8},
    "4096x4096x512 bf16": {"value": 410.0, "target": None, "unit": "TFLOP/s", "ratio_to_reference": 0.93,
                           "shape": [4096, 4096, 512]},
    "softmax 8192x4096 fp32 speed-up over torch.softmax": {
        "value": 1.55, "target": 1.0, "unit": "x", "seconds": 7.1e-05, "reference_seconds": 0.00011,
        "reference": "torch.softmax", "gbps": 3780.0, "torch_gbps": 2440.0,
        "timing": {"median_s": 7.1e-05, "p10_s": 7e-05, "p90_s": 7.3e-05, "n": 50, "wall_per_call_s": None,
                   "seconds": 7.1e-05, "escaped": False, "device": "NVIDIA H200"}},
    "end-to-end step speed-up": {"value": 1.12, "target": None, "unit": "x", "model": "GPTConfig(d_model=1024)",
                                 "batch": 8},
    "experiments": {"value": 6, "target": None, "unit": ""},
    "relative error": {"value": 3.1e-08, "target": 1e-05, "unit": ""},
}


def _old_result(week="week01", figures=None, check="answers"):
    """A grade's JSON as the earlier versions wrote it (GradeResult.as_dict() of dict figures)."""
    return {"week": week, "tier": "cpu", "device": "cpu", "fingerprint": "f", "started_at": "2026-11-01T10:00:00",
            "seconds": 3.0, "grader_version": "0.1.0", "sandboxed": True, "complete": True,
            "verified_on_gpu": False, "counts": {"passed": 1, "failed": 0, "error": 0, "blocked": 0},
            "checks": [{"id": check, "title": check, "kind": "correctness", "needs": "cpu", "status": "passed",
                        "message": "", "figures": OLD_FIGURES if figures is None else figures, "seconds": 1.0}]}


# ---------------------------------------------------------------------------------------------- the model
def test_every_old_figure_reads_and_writes_back_unchanged():
    for name, old in OLD_FIGURES.items():
        figure = Figure.from_dict(old)
        assert figure.as_dict() == old, name
        assert Figure.from_dict(json.loads(json.dumps(figure.as_dict()))) == figure
    wide = Figure.from_dict(OLD_FIGURES["TFLOP/s at 4096^3 bf16"])
    assert (wide.value, wide.unit, wide.target, wide.fraction_of_ceiling, wide.label) == \
        (601.5, "TFLOP/s", 555.2, 0.8667, "matmul 4096x4096x4096 bf16")
    assert wide.detail == {"peak_tflops": 694.0, "copy_gbps": 4244.8}
    assert Figure.from_dict({"value": 2}).as_dict() == {"value": 2.0, "target": None, "unit": ""}


@pytest.mark.parametrize("data, says", [
    ({"value": float("nan")}, "value must be a finite number"),
    ({"value": float("inf"), "unit": "GB/s"}, "value must be a finite number"),
    ({"value": True}, "value must be a finite number"),
    ({"value": "fast"}, "value must be a finite number"),
    ({"unit": "s"}, "has no value"),
    ({"value": 1.0, "target": "high"}, "target must be a finite number"),
    ({"value": 1.0, "seconds": -1e-6}, "seconds must not be negative"),
    ({"value": 1.0, "bytes": float("nan")}, "bytes must be a finite number"),
    ({"value": 1.0, "fraction_of_ceiling": -0.5}, "fraction_of_ceiling must not be negative"),
    ({"value": 1.0, "unit": 7}, "unit must be text"),
    ({"value": 1.0, "label": "x" * 400}, "label must be text of at most"),
    ({"value": 1.0, "shape": [[1, 2], [3]]}, "shape must be text, a number"),
    ({"value": 1.0, "timing": {"samples": {"a": 1}}}, "timing.samples must be text"),
    ({"value": 1.0, "gbps": float("-inf")}, "gbps must be a finite number"),
    ([1.0], "a figure is a JSON object"),
])
def test_a_figure_no_grader_records_is_refused(data, says):
    with pytest.raises(FigureError, match=says):
        Figure.from_dict(data)


def test_record_refuses_a_key_no_module_knows():
    """`record(..., refrence_seconds=...)` would silently lose the plot's bar: it is refused, naming the keys."""
    with pytest.raises(FigureError, match=r"unknown figure key\(s\) \['refrence_seconds'\]"):
        Figure.of(1.0, unit="x", refrence_seconds=1e-3)
    figure = Figure.of(3, target=2, unit="GB/s", seconds=1e-6, shape=[8, 8])
    assert figure.value == 3.0 and figure.seconds == 1e-6 and figure.detail == {"shape": [8, 8]}
    with pytest.raises(FigureError, match="detail repeats the typed key"):
        Figure(value=1.0, detail={"seconds": 1.0})


def test_the_typed_keys_are_the_dataclass_fields():
    from dataclasses import fields

    from infracourse.grading.results import _TYPED
    assert _TYPED | {"value", "detail"} == {f.name for f in fields(Figure)} and not DETAIL_KEYS & _TYPED


def test_every_grader_records_only_known_keys():
    """Every keyword a grader passes to record (directly or through perf.require_fraction/require_speedup) is a
    Figure field or a DETAIL_KEYS entry: the GPU-only checks, which CPU tests never run, included."""
    from infracourse.grading.results import _TYPED
    own = {"require_fraction": {"unit", "what", "record", "name", "target"},
           "require_speedup": {"reference", "what", "record", "name", "target"}}
    files = sorted((REPO / "graders").rglob("*.py")) + [REPO / "src/infracourse/grading/perf.py",
                                                        REPO / "src/infracourse/grading/report_check.py"]
    unknown = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("record", "_record", "figures", "require_fraction", "require_speedup"):
                keys = {k.arg for k in node.keywords if k.arg} - own.get(name, {"target"})
                unknown += [f"{path.relative_to(REPO)}:{node.lineno} {k}" for k in keys - _TYPED - DETAIL_KEYS]
    assert unknown == []


def test_a_check_result_takes_figures_or_their_json_and_refuses_bad_ones():
    check = CheckResult("c", "c", "performance", "cpu", "passed", figures={"x": {"value": 1, "unit": "s"}})
    assert check.headline == Figure(value=1.0, unit="s") and check.headline.shown() == ("1 s", "")
    assert Figure(value=3788.0, unit="GB/s", target=2971.4).shown() == ("3788 GB/s", "2971 GB/s")
    with pytest.raises(FigureError, match="figure 'x': value must be a finite number"):
        CheckResult("c", "c", "performance", "cpu", "passed", figures={"x": {"value": math.nan}})
    with pytest.raises(FigureError, match="figures must be a mapping"):
        CheckResult("c", "c", "performance", "cpu", "passed", figures=[{"value": 1.0}])


# ------------------------------------------------------------------------------------ stored grades load
def test_a_progress_database_written_before_figures_were_typed_loads(tmp_path):
    path = tmp_path / "progress.db"
    Progress(path)  # the schema (unchanged by Figure): then a grade row as the earlier version wrote it
    with closing(sqlite3.connect(path)) as db, db:
        cur = db.execute("INSERT INTO grades (week, started_at, seconds, tier, device, fingerprint, complete, "
                         "verified_on_gpu, result_json) VALUES ('week01', 't', 3.0, 'cpu', 'cpu', 'f', 1, 0, ?)",
                         (json.dumps(_old_result()),))
        db.execute("INSERT INTO checks VALUES (?, 'answers', 'passed', '', 601.5, 555.2, 'TFLOP/s')",
                   (cur.lastrowid,))
    store = Progress(path, must_exist=True)
    last = store.last_grade("week01")
    assert last.checks[0].figures == {n: Figure.from_dict(f) for n, f in OLD_FIGURES.items()}
    assert last.as_dict()["checks"][0]["figures"] == OLD_FIGURES  # the same JSON goes back to disk
    assert store.weeks_summary() == {"week01": {"attempts": 1, "passed": True, "verified_on_gpu": False}}
    store.record(last)  # and a new grade row carries its headline figure in the checks table
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value, target, unit FROM checks ORDER BY grade_id DESC LIMIT 1").fetchone() == \
            (601.5, 555.2, "TFLOP/s")


def test_a_grade_result_json_of_a_week_folder_loads():
    result = GradeResult.from_dict(json.loads(json.dumps(_old_result())))
    assert result.checks[0].headline.value == 601.5 and result.complete


@pytest.fixture(scope="module")
def cohort_course(tmp_path_factory):
    return synthetic.write_course(tmp_path_factory.mktemp("course"), weeks=3, kernel_weeks=(2,))


def _bundle_with(course, tmp_path, figures):
    """A week02 bundle of the synthetic cohort whose bandwidth check carries `figures` (old-format JSON)."""
    good = synthetic.write_cohort(course, tmp_path / "b", learners=4, missing=0, seed=3)
    source = next(p for p in good if p.name.endswith("week02.zip") and
                  json.loads(members(p)["results.json"])["checks"][2]["figures"])
    files = members(source)
    result = json.loads(files["results.json"])
    result["checks"][2]["figures"] = figures
    return rezip(tmp_path / "old.zip", {**files, "results.json": json.dumps(result).encode()}, rehash=True)


def test_an_old_bundle_imports_and_its_figures_reach_the_gradebook(cohort_course, tmp_path):
    old = {"bandwidth": {"value": 3000.0, "target": 2546.9, "unit": "GB/s", "ceiling": 4244.8,
                         "fraction_of_ceiling": 0.7067, "timing": OLD_FIGURES[
                             "softmax 8192x4096 fp32 speed-up over torch.softmax"]["timing"], "shape": [8192, 4096]},
           "no fraction": {"value": 2122.4, "unit": "GB/s"}}  # normalised by the bundle's ceilings instead
    book = Gradebook.create(tmp_path / "g.db", cohort_course)
    bundle = _bundle_with(cohort_course, tmp_path, old)
    copy_gbps = json.loads(members(bundle)["manifest.json"])["ceilings"]["copy_gbps"]
    report = book.import_bundles([bundle], cohort_course)
    assert report.rejected == [] and len(report.imported) == 1
    rows = [row for row in book.snapshot()["figures"] if row[2] in old]  # (the bundle's other checks have theirs)
    assert sorted((name, value, unit) for _, _, name, value, unit, _ in rows) == \
        [("bandwidth", 3000.0, "GB/s"), ("no fraction", 2122.4, "GB/s")]
    shares = {name: share for _, _, name, _, _, share in rows}
    assert shares["bandwidth"] == 0.7067 and shares["no fraction"] == pytest.approx(2122.4 / copy_gbps)
    (fingerprint, stored), = book.results_of(1, "self")
    assert stored.checks[2].figures["bandwidth"].as_dict() == old["bandwidth"]


@pytest.mark.parametrize("bad, says", [
    ({"value": "3000", "unit": "GB/s"}, "value must be a finite number"),
    ({"value": 3000.0, "unit": "GB/s", "seconds": -1.0}, "seconds must not be negative"),
    ({"value": 3000.0, "unit": "GB/s", "shape": {"deep": {"er": 1}}}, "must be text"),
])
def test_a_bundle_with_a_figure_no_grader_writes_is_refused(cohort_course, tmp_path, bad, says):
    book = Gradebook.create(tmp_path / "g.db", cohort_course)
    report = book.import_bundles([_bundle_with(cohort_course, tmp_path, {"bandwidth": bad})], cohort_course)
    assert report.imported == [] and len(report.rejected) == 1 and says in report.rejected[0].reason


# ------------------------------------------------------------------------------------- through a grade
CHECKS = ("  - {id: answers, title: \"answers\"}\n"
          "  - {id: nan, title: \"measures NaN\"}\n"
          "  - {id: typo, title: \"misspells a key\"}\n")
GRADERS = '''import pytest


@pytest.mark.check("answers")
def test_answers(learner, record):
    assert learner.module("probe").answer() == 42
    record("answer", 42, target=42, unit="", label="probe", seconds=1e-3, shape=[6, 7])


@pytest.mark.check("nan")
def test_nan(record):
    got = float("nan")
    record("rate", got, target=1.0, unit="GB/s")
    assert not got < 1.0  # a NaN compares false: without the Figure check this would pass


@pytest.mark.check("typo")
def test_typo(record):
    record("speed-up", 2.0, target=1.0, unit="x", refrence_seconds=1e-3)
'''


def test_figures_cross_from_the_judge_typed_and_bad_ones_are_errors(tmp_path, machine):
    course = make_course(tmp_path / "course", CHECKS, GRADERS, "answers")
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "probe.py").write_text("def answer():\n    return 42\n")
    checks = {c.id: c for c in grade(course, "week01", learner, hardware=machine).checks}
    assert checks["answers"].status == "passed", checks["answers"].message
    assert checks["answers"].figures == {"answer": Figure(value=42.0, target=42.0, label="probe", seconds=1e-3,
                                                          detail={"shape": [6, 7]})}
    assert checks["nan"].status == "error" and "the figure 'rate' cannot be recorded" in checks["nan"].message
    assert "value must be a finite number" in checks["nan"].message and checks["nan"].figures == {}
    assert checks["typo"].status == "error" and "refrence_seconds" in checks["typo"].message


def test_the_runner_turns_a_malformed_figure_from_the_judge_into_an_error(tmp_path):
    course = make_course(tmp_path / "course", CHECKS, GRADERS, "answers")
    channel = Channel(course.lab("week01"), folder=tmp_path)
    channel.send(event="start", check="answers")
    channel.send(event="result", check="answers", status="passed", figures={"fast": {"value": "1e9", "unit": "GB/s"}})
    assert channel.newly["answers"].status == "error" and channel.newly["answers"].figures == {}
    assert "malformed figure (figure 'fast': value must be a finite number" in channel.newly["answers"].message
    assert channel.seen[-1]["status"] == "error"
