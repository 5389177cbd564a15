"""The NVIDIA track's project proves its grader: the solution passes weeks 22 and 24, the starter fails every check
with a message that says what to do, each wrong variant the issue names fails its check, and an honest solution
with another kernel structure passes.

A project's raw data and report figures belong to the machine that measured them. The proofs first run the
project's own command (run.py) on the machine under test and take its raw data and figures (`measured_here`), as
a learner re-running the project on that machine would."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, replace_once
from labproof import assert_solution_passes, assert_variant_fails

pytestmark = pytest.mark.slow

TRACK = "nvidia"
SOLUTION = REPO / "labs" / "track-nvidia" / "solution"
HONEST = Path(__file__).parent / "fixtures" / "track-nvidia-honest"
WEEK22 = {"environment-pinned", "run-command", "project-plan", "baseline-hotspot"}
# report figure <- (raw file, key) as run.py writes them
FIGURES = {"norm_share": ("baseline", "norm_share"), "launches_per_step": ("baseline", "launches_per_step"),
           "copies_per_step": ("baseline", "copies_per_step"), "operator_speedup": ("optimised", "operator_speedup"),
           "end_to_end_speedup": ("optimised", "end_to_end_speedup"),
           "launches_per_step_optimised": ("optimised", "launches_per_step"), "mfu": ("baseline", "mfu")}


def _figure(name: str, value: float):
    def _edit(text: str) -> str:
        pattern = re.compile(rf"^{name}:.*$", re.MULTILINE)
        assert len(pattern.findall(text)) == 1, name
        return pattern.sub(f"{name}: {value:.6g}", text)
    return _edit


_RUNS: dict[tuple, tuple[dict, dict]] = {}  # run.py's raw data per files given, once per test process


def measured_here(machine, tmp_path, files: dict[str, str] | None = None) -> dict:
    """Edits that give the solution (with `files` over it) this machine's raw data and report figures: the output
    of its run.py run here, as a learner re-running the project on the machine graded would. On a CPU too: a
    CPU's figures belong to the machine (the unfused norm took 0.12 ms on the host that wrote the shipped raw
    data and 0.49 ms on CI's, a share of 0.04 against 0.15), so shipped ones cannot stand for this machine's."""
    written = {name: text for name, text in (files or {}).items() if isinstance(text, str)}  # edits run.py reads
    key = tuple(sorted(written.items()))
    if key not in _RUNS:
        work = tmp_path / "measured-here"
        shutil.copytree(SOLUTION, work, dirs_exist_ok=True)
        for name, text in written.items():
            (work / name).write_text(text)
        shutil.rmtree(work / "raw", ignore_errors=True)
        subprocess.run([sys.executable, "run.py", "--out", "raw"], cwd=work, check=True, timeout=600,
                       capture_output=True)
        texts = {f"raw/{p.name}": p.read_text() for p in (work / "raw").glob("*.json")}
        _RUNS[key] = texts, {kind: json.loads(texts[f"raw/{kind}.json"]) for kind in ("baseline", "optimised")}
    texts, raw = _RUNS[key]
    edits = {**(files or {}), **texts}

    def report(text: str) -> str:
        for name, (kind, key) in FIGURES.items():
            text = _figure(name, raw[kind][key])(text)
        if not machine.gpu_count:  # the GPU experiments stay to be verified
            return text
        return re.sub(r"^to_be_verified:.*$", "to_be_verified: []", text, flags=re.MULTILINE)

    edits["report.md"] = (lambda text, old=edits.get("report.md"): report(old(text) if callable(old) else old or text))
    return edits


def _judging(monkeypatch):
    """graders/track-nvidia/track_nvidia_judging.py, the judge's side (never mounted in the sandbox)."""
    monkeypatch.syspath_prepend(str(REPO / "graders" / "track-nvidia"))
    import track_nvidia_judging
    return track_nvidia_judging


def test_kit_hotspot_reference_figures(monkeypatch):
    """The course side the judge measures with: the unfused baseline is the model's own norm, the Amdahl bound,
    and the judge's FLOPs formula against what torch counts (matmuls; CPU attention has no flop formula)."""
    import torch

    from infracourse.kit import hotspot
    from infracourse.kit.gpt import GPT, RMSNorm, synthetic_batch

    norm = RMSNorm(32)
    with torch.no_grad():
        norm.weight.mul_(torch.rand(32))
    x = torch.randn(3, 5, 32)
    assert torch.equal(hotspot.unfused_rms_norm(x, norm.weight, norm.eps), norm(x))
    assert hotspot.amdahl_bound(0.0, 10.0) == 1.0 and abs(hotspot.amdahl_bound(0.25, 1e9) - 4 / 3) < 1e-6
    size = hotspot.project_size("cpu")
    model = GPT(size.config, seed=0)
    counted, with_attention = hotspot.counted_flops(model, *synthetic_batch(size.config, size.batch, seed=0))
    cfg = size.config
    attention = 3 * size.tokens * cfg.n_layer * 4 * cfg.seq_len * cfg.d_model
    formula = _judging(monkeypatch).model_flops_per_step
    assert counted + (0 if with_attention else attention) == formula(cfg, size.tokens)



# estimates.py returning the course's FLOPs formula, then in kit.hotspot (mounted for run.py): it passed mfu-estimate
COURSE_FORMULA = ("from infracourse.kit.gpt import GPTConfig\n"
                  "from infracourse.kit.hotspot import model_flops_per_step as course_formula\n\n\n"
                  "def model_flops_per_step(config: dict, tokens: int) -> int:\n"
                  "    return course_formula(GPTConfig(**config), tokens)\n")


@pytest.mark.variant
def test_the_judges_flops_formula_is_out_of_the_learners_reach(grade_lab, monkeypatch):
    """The formula mfu-estimate compares with is graders/track-nvidia/track_nvidia_judging.py's, not the kit's."""
    from infracourse.kit import hotspot
    assert not hasattr(hotspot, "model_flops_per_step") and callable(_judging(monkeypatch).model_flops_per_step)
    _, checks = grade_lab("week23", edits={"estimates.py": COURSE_FORMULA}, track=TRACK, checks=["mfu-estimate"])
    check = checks["mfu-estimate"]
    assert check.status != "passed" and "cannot import name 'model_flops_per_step'" in check.message, \
        (check.status, check.message)

def test_week22_solution_passes_with_its_own_checks_only(grade_lab, machine, tmp_path):
    checks = assert_solution_passes(grade_lab, machine, "week22", edits=measured_here(machine, tmp_path), track=TRACK)
    assert set(checks) == WEEK22
    assert checks["baseline-hotspot"].figures["launches per baseline step"].value > 0


def test_week24_solution_passes_every_check_this_machine_can_run(grade_lab, machine, tmp_path):
    checks = assert_solution_passes(grade_lab, machine, "week24", edits=measured_here(machine, tmp_path), track=TRACK)
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["operator-speedup-gpu"].message
    bound = checks["hotspot-effect"].figures["Amdahl bound"].value
    assert checks["amdahl-claim"].figures["end-to-end claim"].value <= bound * 1.1


def test_starter_fails_every_check_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week24", source="starter", stamp=False, track=TRACK)
    assert not result.complete
    for check in checks.values():
        assert check.status in ("failed", "blocked"), (check.id, check.status, check.message)
    assert "raw/baseline.json is missing" in checks["baseline-hotspot"].message
    assert "not written yet" in checks["operator-correct"].message and "rms_norm" in checks["operator-correct"].message
    assert "not written yet" in checks["mfu-estimate"].message
    for later in ("hotspot-effect", "failure-case"):
        assert "operator-correct" in checks[later].message  # no credit before the operator is correct


def _invented_regression(machine):
    """The model's own norm shape, where the operator does not lose, recorded as a 0.5x regression."""
    from infracourse.kit.hotspot import project_size

    size = project_size("cuda" if machine.gpu_count else "cpu")
    rows, cols = size.norm_shape
    case = json.dumps({"rows": rows, "cols": cols, "dtype": str(size.dtype).removeprefix("torch."), "speedup": 0.5})
    return lambda text: re.sub(r'"regression": \{.*?\}', f'"regression": {case}', text, flags=re.DOTALL)


VARIANTS = {
    # a lock written for another machine
    "torch pinned at another version": ("week22", "environment-pinned", lambda machine: {
        "requirements.lock": lambda text: re.sub(r"^torch==.*$", "torch==2.9.1", text, flags=re.MULTILINE)}),
    # eps dropped from the square root, on both paths: rows far below sqrt(eps) blow up
    "eps forgotten": ("week23", "operator-correct", lambda machine: {"fused_norm.py": lambda text: replace_once(
        "tl.sum(x * x, axis=0) / n_cols + eps)", "tl.sum(x * x, axis=0) / n_cols)")(
        replace_once("x32.pow(2).mean(-1) + eps)", "x32.pow(2).mean(-1))")(text))}),
    # a failure case that is not one
    "invented regression": ("week24", "failure-case",
                            lambda machine: {"raw/failure.json": _invented_regression(machine)}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, machine, tmp_path, name):
    week, check_id, edits = VARIANTS[name]
    wrong = edits(machine)
    here = measured_here(machine, tmp_path)
    for file, edit in here.items():  # this machine's data first, the variant's edit on top
        if file in wrong:
            wrong[file] = (lambda text, first=edit, then=wrong[file]:
                           then(first(text) if callable(first) else first))
        else:
            wrong[file] = edit
    assert_variant_fails(grade_lab, week, check_id, wrong, track=TRACK)


def test_end_to_end_claim_above_the_amdahl_bound_fails(grade_lab, machine, tmp_path):
    """The operator's speed-up read as the model's: 3x end to end is far above what a norm of a minority share of
    the step allows, on a CPU or a GPU."""
    edits = measured_here(machine, tmp_path)
    first = edits.get("report.md", lambda text: text)
    edits["report.md"] = lambda text: _figure("end_to_end_speedup", 3.0)(first(text))
    message = assert_variant_fails(grade_lab, "week23", "amdahl-claim", edits, track=TRACK).message
    assert "speed-up of 3x" in message and "share s = " in message and "Amdahl allows at most" in message


def test_honest_solution_with_row_blocks_passes(grade_lab, machine, tmp_path):
    """Another kernel structure (several rows per program, the backward in torch from the saved rstd), another way
    to count FLOPs, and its own run's raw data and report."""
    files = {path.relative_to(HONEST).as_posix(): path.read_text() for path in HONEST.rglob("*") if path.is_file()}
    files["report.md"] = _with_this_machines_environment(files["report.md"])
    assert_solution_passes(grade_lab, machine, "week24", edits=measured_here(machine, tmp_path, files), track=TRACK)


def _with_this_machines_environment(report: str):
    """An edit giving the fixture's report the Environment section grade_lab stamped on the solution's: the
    fixture's own names the machine it was written on (an AMD EPYC), which another machine's grade refuses."""
    section = re.compile(r"^##\s+Environment\s*$.*?(?=^##\s|\Z)", re.MULTILINE | re.DOTALL)
    return lambda stamped: section.sub(lambda _: section.search(stamped).group(0), report, count=1)
