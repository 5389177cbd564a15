"""Week 6 proves its grader: the solution passes, the starter fails, each wrong variant fails its check, and an
honest solution written from the handout in another style (tests/fixtures/week06-honest) passes."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week06")
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["memory-gpu-peak"].message


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week06", source="starter", stamp=False)
    assert not result.complete
    for check_id in ("memory-params", "memory-grads", "memory-optimizer", "memory-activations"):
        assert checks[check_id].status == "failed"
        assert "count the bytes of each part" in checks[check_id].message
    # the starter runs the provided step: right results, with its sync and its copy
    assert checks["step-correct"].status == "passed"
    assert "_local_scalar_dense" in checks["profile-no-sync"].message
    assert "aten::cat" in checks["profile-no-copy"].message


CLIP = "    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM, foreach=True)\n"
NUMPY_CLIP = ("    import numpy as np\n"
              "    grads = [p.grad for p in model.parameters()]\n"
              "    norm = float(np.linalg.norm(np.concatenate([g.numpy().ravel() for g in grads])))\n"
              "    torch._foreach_mul_(grads, min(1.0, MAX_GRAD_NORM / (norm + 1e-6)))\n")
VARIANTS = {
    "memory.py": {
        "Adam states counted once": ("memory-optimizer", replace_once("else 2 * e * n", "else e * n")),
        "fp32 master weights forgotten": ("memory-optimizer", replace_once("3 * 4 * n if", "2 * 4 * n if")),
        "tied head counted twice": ("memory-params", replace_once(
            "return cfg.vocab_size * C +", "return 2 * cfg.vocab_size * C +")),
        "bf16 gradients counted as fp32": ("memory-grads", replace_once('"grads": e * n', '"grads": 4 * n')),
        # class 4: right numbers, measured rather than estimated
        "parameters counted on a meta-device model": ("memory-params", replace_once(
            "    return cfg.vocab_size * C + cfg.seq_len * C + cfg.n_layer * per_block + C",
            "    import torch\n    from infracourse.kit.gpt import GPT\n"
            "    with torch.device(\"meta\"):\n        return sum(p.numel() for p in GPT(cfg).parameters())")),
        "activations measured with saved-tensor hooks": ("memory-activations", replace_once(
            "    return cfg.n_layer * block + head + token_ids",
            "    import torch\n    from infracourse.kit.gpt import GPT, synthetic_batch\n"
            "    model = GPT(cfg).to({4: torch.float32, 2: torch.bfloat16}[e])\n"
            "    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}\n"
            "    seen = {}\n"
            "    def pack(t):\n"
            "        if t.untyped_storage().data_ptr() not in weights:\n"
            "            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()\n"
            "        return t\n"
            "    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):\n"
            "        model(*synthetic_batch(cfg, batch, seed=0))\n"
            "    return sum(seen.values())")),
        "log-softmax output left out": ("memory-activations", replace_once(
            "head = norm + e * B * T * V", "head = norm")),
    },
    "checkpointing.py": {
        "blocks run plainly": ("checkpoint-activations", replace_once(
            "x = checkpoint(block, x, use_reentrant=False)", "x = block(x)")),
        # the memory drops, but the blocks' weights get no gradient
        "blocks run without autograd": ("checkpoint-activations", replace_once(
            "x = checkpoint(block, x, use_reentrant=False)",
            "with torch.no_grad():\n            x = block(x)\n        x.requires_grad_()")),
    },
    "step.py": {
        "loss read with .item() every step": ("profile-no-sync", replace_once(
            'metrics.get("loss_sum", 0.0) + loss.detach()', 'metrics.get("loss_sum", 0.0) + loss.item()')),
        "gradients concatenated for the norm": ("profile-no-copy", replace_once(
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM, foreach=True)\n",
            "    grads = [p.grad for p in model.parameters()]\n"
            "    norm = torch.cat([g.flatten() for g in grads]).norm()\n"
            "    torch._foreach_mul_(grads, (MAX_GRAD_NORM / (norm + 1e-6)).clamp(max=1.0))\n")),
        # class 5: no aten::_local_scalar_dense and no torch allocation, yet a host read and a full copy
        "gradient norm through NumPy (read)": ("profile-no-sync", replace_once(CLIP, NUMPY_CLIP)),
        "gradient norm through NumPy (copy)": ("profile-no-copy", replace_once(CLIP, NUMPY_CLIP)),
        "clipping dropped": ("step-correct", replace_once(
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM, foreach=True)\n", "")),
    },
}
CASES = [(file, name) for file, variants in VARIANTS.items() for name in variants]


@pytest.mark.parametrize("file,name", CASES, ids=[name for _, name in CASES])
def test_wrong_variant_fails_its_check(grade_lab, file, name):
    check_id, edit = VARIANTS[file][name]
    assert_variant_fails(grade_lab, "week06", check_id, {file: edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week06", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    if not machine.gpu_count:
        pytest.skip("the figure is measured on a GPU; without one its check is blocked and it is not compared")
    _, checks = grade_lab("week06", edits={"report.md": invented("estimated_total_bytes", 10.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "estimated_total_bytes = " in checks["report"].message and "the grader measured" in checks["report"].message


HONEST = Path(__file__).parent / "fixtures" / "week06-honest"


@pytest.mark.parametrize("style", ["week06-honest", "week06-b-honest"])
def test_honest_solution_in_another_style_passes(course, machine, tmp_path, style):
    from infracourse.grading.report import stamp_environment
    from infracourse.grading.runner import grade

    lab = course.lab("week06")
    folder = tmp_path / "week06-honest"
    shutil.copytree(lab.solution, folder)
    shutil.rmtree(folder / "traces")  # the honest step's own traces, written by its own script
    for name in ("memory.py", "step.py", "checkpointing.py", "profile_traces.py"):
        shutil.copy(HONEST.parent / style / name, folder / name)
    subprocess.run([sys.executable, "profile_traces.py"], cwd=folder, check=True, capture_output=True)
    stamp_environment(folder / lab.spec.report, machine)
    result = grade(course, "week06", folder, hardware=machine)
    for check in result.checks:
        expected = "passed" if machine.satisfies(check.needs) else "blocked"
        assert check.status == expected, (check.id, check.status, check.message)
    assert result.complete


def _grade_with_traces(course, machine, folder, change):
    """The solution with its traces changed, graded on profile-traces (and step-correct, which it requires): no
    other check reads the traces, so the rest of the week would grade the solution's own files again."""
    from infracourse.grading.report import stamp_environment
    from infracourse.grading.runner import grade

    lab = course.lab("week06")
    shutil.copytree(lab.solution, folder)
    change(folder)
    stamp_environment(folder / lab.spec.report, machine)
    return {c.id: c for c in grade(course, "week06", folder, hardware=machine, checks=["profile-traces"]).checks}


@pytest.mark.variant
def test_traces_of_another_step_fail(course, machine, tmp_path):
    """class 1: traces recorded from the provided slow step, not the learner's, fail profile-traces."""
    def stale(folder):
        script = folder / "profile_traces.py"
        original = script.read_text()
        script.write_text(original.replace("from step import train_step",
                                           "from infracourse.kit.train import slow_train_step as train_step"))
        subprocess.run([sys.executable, "profile_traces.py"], cwd=folder, check=True, capture_output=True)
        script.write_text(original)

    checks = _grade_with_traces(course, machine, tmp_path / "stale", stale)
    assert checks["profile-traces"].status == "failed", checks["profile-traces"].message
    assert "does not record one step of your current train_step" in checks["profile-traces"].message


@pytest.mark.variant
def test_trace_of_the_wrong_precision_fails(course, machine, tmp_path):
    def relabel(folder):
        shutil.copy(folder / "traces" / "step-T128-fp32.json.gz", folder / "traces" / "step-T128-bf16.json.gz")

    checks = _grade_with_traces(course, machine, tmp_path / "relabelled", relabel)
    assert checks["step-correct"].status == "passed", checks["step-correct"].message  # else no trace is judged
    assert checks["profile-traces"].status == "failed"
    assert "not bf16" in checks["profile-traces"].message
