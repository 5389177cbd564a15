"""The Cambricon track (weeks 22-24) proves its grader: the solution passes week 22 with only that week's checks
and week 24 with all of them (the MLU checks blocked, to be verified), the starter fails teaching, each wrong
variant fails its check, and an honest solution in another style (tests/fixtures/track-cambricon-honest) passes."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails

pytestmark = pytest.mark.slow

TRACK = "cambricon"
MLU_CHECKS = ("mlu-precision", "mlu-latency", "mlu-memory")
HONEST = Path(__file__).parent / "fixtures" / "track-cambricon-honest"


def test_week22_grades_the_reference_alone(grade_lab, machine, course):
    checks = assert_solution_passes(grade_lab, machine, "week22", track=TRACK)
    assert set(checks) == set(course.track(TRACK).weeks["week22"])


def test_week24_solution_passes_and_the_mlu_checks_are_to_be_verified(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week24", track=TRACK)
    for check in MLU_CHECKS:
        if not machine.satisfies("mlu"):
            assert checks[check].status == "blocked"
            assert "to be verified on an MLU" in checks[check].message


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week24", source="starter", stamp=False, track=TRACK)
    assert not result.complete
    for check, words in {"reference-run": "write reference.capture", "harness-clean": "write harness.compare",
                         "harness-flags-perturbed": "write harness.compare", "op-list": "write ops.traced_ops",
                         "device-memory-estimate": "write estimates.weight_bytes",
                         "call-chain": "one entry per op", "reference-raw-data": "python run.py --out raw",
                         "failure-case": "python run.py --out raw"}.items():
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
        assert words in checks[check].message, (check, checks[check].message)
    for check in ("environment-pinned", "run-command", "report"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)


HARNESS_VARIANTS = {
    # one tolerance for every dtype, loose enough for bfloat16: a float32 layer computed in bf16 passes
    "a tolerance that ignores the dtype": ("harness-flags-perturbed", replace_once(
        "TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}",
        "TOLERANCE = {torch.float32: 1e-2, torch.bfloat16: 1e-2, torch.float16: 1e-2}")),
    # only the logits are judged: in an isolated run the final output never sees a broken layer
    "judges only the final output": ("harness-flags-perturbed", replace_once(
        "    first = next(", "    for layer in layers[:-1]:\n        layer[\"ok\"] = True\n    first = next(")),
    # bit for bit: a correct port with other kernels rounds differently and is flagged
    "no tolerance at all": ("harness-clean", replace_once(
        '"ok": max_abs <= TOLERANCE[device.dtype] * scale}', '"ok": max_abs == 0}')),
}


@pytest.mark.parametrize("name", HARNESS_VARIANTS)
def test_wrong_harness_fails_its_check(grade_lab, name):
    check, edit = HARNESS_VARIANTS[name]
    assert_variant_fails(grade_lab, "week23", check, {"harness.py": edit}, track=TRACK)


def test_op_list_missing_the_view_ops_fails(grade_lab):
    edit = replace_once('if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)',
                        'if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)\n'
                        '                                    and "view" not in str(node.target)')
    assert_variant_fails(grade_lab, "week23", "op-list", {"ops.py": edit}, track=TRACK)


def test_estimate_that_measures_instead_fails(grade_lab):
    """Bytes counted from a model built in the call equal the formula's, but they are a measurement."""
    measured = ("\n\ndef activation_bytes(vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head, batch,"
                " dtype_bytes):\n    from infracourse.kit.porting import measured_bytes\n"
                "    config = dict(vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_head=n_head, "
                "n_layer=n_layer, mlp_ratio=mlp_ratio, n_kv_head=n_kv_head)\n"
                "    return measured_bytes(config, batch, {4: 'float32', 2: 'bfloat16'}[dtype_bytes])['activations']\n")
    assert_variant_fails(grade_lab, "week23", "device-memory-estimate", {"estimates.py": lambda text: text + measured},
                         track=TRACK)



# kit.porting is mounted for run.py's stand-in device, and it holds the judge's side: each file below returned the
# judge's own answer and passed its check, until the judge's reading refused kit.porting in the graded file
PORTING_SHORTCUTS = {
    "reference.capture returns kit.porting.reference_run": ("week22", "reference-run", "reference.py", replace_once(
        "    cfg = GPTConfig(**{**CONFIG, **config})\n    model = GPT(cfg, seed=seed).eval()\n",
        "    from infracourse.kit.porting import reference_run\n    return reference_run(config, seed, batch)\n"
        "    cfg = GPTConfig(**{**CONFIG, **config})\n    model = GPT(cfg, seed=seed).eval()\n")),
    "ops.traced_ops returns kit.porting.traced_ops": ("week23", "op-list", "ops.py", replace_once(
        "    cfg = GPTConfig(**{**CONFIG, **config})\n    model = GPT(cfg, seed=0).eval()\n",
        "    from infracourse.kit import porting\n    return dict(porting.traced_ops(config, batch))\n"
        "    cfg = GPTConfig(**{**CONFIG, **config})\n    model = GPT(cfg, seed=0).eval()\n")),
    "harness figures from kit.porting.layer_metrics": ("week23", "harness-clean", "harness.py", replace_once(
        "    max_abs = diff.max().item()\n    cosine = torch.nn.functional.cosine_similarity(ref, dev, dim=0).item()\n",
        "    from infracourse.kit.porting import layer_metrics\n"
        "    max_abs, cosine = layer_metrics(reference, device).values()\n")),
}


@pytest.mark.parametrize("name", PORTING_SHORTCUTS)
def test_the_judges_porting_answers_are_refused(grade_lab, name):
    week, check_id, file, edit = PORTING_SHORTCUTS[name]
    check = assert_variant_fails(grade_lab, week, check_id, {file: edit}, track=TRACK)
    assert f"{file}:" in check.message and "reaches infracourse.kit.porting" in check.message, check.message

def test_report_with_a_simulated_mlu_latency_fails(grade_lab):
    edit = replace_once("failure_max_abs_error: 2.86e-4\n", "failure_max_abs_error: 2.86e-4\nmlu_forward_ms: 1.9\n")
    assert_variant_fails(grade_lab, "week24", "report", {"report.md": edit}, track=TRACK)


def test_lock_that_disagrees_with_the_environment_fails(grade_lab):
    import torch

    edit = replace_once(f"torch=={torch.__version__}\n", "torch==2.1.0\n")
    assert_variant_fails(grade_lab, "week22", "environment-pinned", {"requirements.lock": edit}, track=TRACK)


def test_honest_solution_in_another_style_passes(grade_lab, machine, tmp_path):
    """Every file of the fixture replaces the solution's; its own run writes the raw data it ships."""
    work = tmp_path / "honest-run"
    shutil.copytree(HONEST, work)
    subprocess.run([sys.executable, "run.py", "--out", "raw"], cwd=work, check=True, capture_output=True, timeout=120)
    edits = {f.name: f.read_text() for f in HONEST.iterdir() if f.is_file()}
    edits.update({f"raw/{f.name}": f.read_text() for f in (work / "raw").iterdir()})
    failure = json.loads((work / "raw" / "failure.json").read_text())["result"]
    first = next(layer for layer in failure["layers"] if layer["name"] == failure["first_divergent"])
    edits["report.md"] = replace_once("failure_max_abs_error: 2.86e-4\n",
                                      f"failure_max_abs_error: {first['max_abs']:.6g}\n")
    checks = assert_solution_passes(grade_lab, machine, "week24", edits=edits, track=TRACK)
    assert checks["harness-flags-perturbed"].status == "passed"


def test_the_stand_in_device_breaks_only_what_the_judge_chose():
    """kit.porting's promises the graders rely on: an isolated error stays in its layer, a chained one leaves the
    layers before it untouched, a clean run differs by rounding only, and the reference repeats bit for bit."""
    import torch

    from infracourse.kit.porting import Perturbation, device_run, reference_run

    reference = reference_run({}, 5, 2)
    assert all(torch.equal(a, b) for a, b in zip(reference.values(), reference_run({}, 5, 2).values()))
    names = list(reference)
    clean = device_run({}, 5, 2)
    for name in names:
        assert (clean[name] - reference[name]).abs().max() <= 1e-6 * reference[name].abs().max()
    broken = device_run({}, 5, 2, perturb=Perturbation((names[4],), "bf16"))
    assert [n for n in names if not torch.equal(broken[n], clean[n])] == [names[4]]
    chained = device_run({}, 5, 2, mode="chained", perturb=Perturbation((names[6],), "noise", 1e-2, 3))
    chained_clean = device_run({}, 5, 2, mode="chained")
    assert all(torch.equal(chained[n], chained_clean[n]) for n in names[:6])
    assert not torch.equal(chained[names[6]], chained_clean[names[6]])
