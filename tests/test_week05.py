"""Week 5 proves its grader: the solution passes, the starter fails, each wrong variant fails its check, and
honest solutions written from the handout in other styles (tests/fixtures/week05-honest) pass."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week05")
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["resume-bf16"].message


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week05", source="starter", stamp=False)
    assert not result.complete
    assert checks["resume-losses"].status == "failed"
    assert "write the training loop" in checks["resume-losses"].message
    assert checks["checkpoint-atomic"].status == "failed"
    assert "write the state atomically" in checks["checkpoint-atomic"].message
    assert checks["report"].status == "failed"
    assert "in your own words" in checks["report"].message


VARIANTS = {
    "forgets the RNG state": ("resume-rng", replace_once(
        '    random.setstate(rng["python"])\n    np.random.set_state(rng["numpy"])\n'
        '    torch.set_rng_state(rng["torch"])\n', "")),
    "forgets NumPy's generator": ("resume-rng", replace_once('    np.random.set_state(rng["numpy"])\n', "")),
    "forgets the scheduler": ("resume-schedule", replace_once(
        '    scheduler.load_state_dict(state["scheduler"])\n', "")),
    "forgets the data position": ("resume-data", replace_once('    batches.load_state_dict(state["data"])\n', "")),
    "forgets the GradScaler": ("resume-fp16-scaler", replace_once('    scaler.load_state_dict(state["scaler"])\n', "")),
    "forgets the optimizer state": ("resume-optimizer", replace_once(
        '    optimizer.load_state_dict(state["optimizer"])\n', "")),
    "repeats the checkpointed step": ("resume-step", replace_once('return state["step"]', 'return state["step"] - 1')),
    "restarts instead of resuming": ("resume-step", replace_once("if path.exists() else 0", "if False else 0")),
    # torch.save straight onto the checkpoint: it truncates the file before writing
    "non-atomic write": ("checkpoint-atomic", replace_once(
        "    with open(tmp, \"wb\") as f:\n        torch.save(state, f)\n        f.flush()\n"
        "        os.fsync(f.fileno())  # the bytes are on disk before the name points at them\n"
        "    os.replace(tmp, path)", "    torch.save(state, path)")),
    # serialised in memory first, so the kill misses the file, but then written over the checkpoint in place
    "writes the bytes over the checkpoint": ("checkpoint-atomic", replace_once(
        "    with open(tmp, \"wb\") as f:\n        torch.save(state, f)\n",
        "    import io\n    buffer = io.BytesIO()\n    torch.save(state, buffer)\n"
        "    with open(path, \"wb\") as f:\n        f.write(buffer.getvalue())\n")),
    # class 4: same losses, steps and final state as a resume, but the checkpoint is only read for its step
    "replays from the seed instead of loading": ("resume-follows-checkpoint", replace_once(
        "    done = restore_state(load_checkpoint(path), model, optimizer, scheduler, batches, scaler) \\\n"
        "        if path.exists() else 0\n",
        "    done = load_checkpoint(path)[\"step\"] if path.exists() else 0\n"
        "    for _ in range(done):  # replayed silently from the seed\n"
        "        inputs, targets = batches.next(device)\n"
        "        model(inputs, targets)[1].backward()\n"
        "        optimizer.step()\n"
        "        scheduler.step()\n"
        "        optimizer.zero_grad(set_to_none=True)\n")),
    # class 6: the bytes are serialised first (the kill misses the file), then written into the checkpoint's
    # own inode through a name that is not the checkpoint's path
    "writes the checkpoint in place through a symlink": ("checkpoint-atomic", replace_once(
        "    with open(tmp, \"wb\") as f:\n        torch.save(state, f)\n        f.flush()\n"
        "        os.fsync(f.fileno())  # the bytes are on disk before the name points at them\n"
        "    os.replace(tmp, path)",
        "    import io\n    buffer = io.BytesIO()\n    torch.save(state, buffer)\n"
        "    alias = path.with_name(path.name + \".link\")\n"
        "    if not alias.is_symlink():\n        os.symlink(path.name, alias)\n"
        "    with open(alias, \"wb\") as f:\n        f.write(buffer.getvalue())")),
    # a temporary file, then copied over the checkpoint (what shutil.move does across filesystems)
    "copies the temporary file over the checkpoint": ("checkpoint-atomic", replace_once(
        "    os.replace(tmp, path)", "    import shutil\n    shutil.copyfile(tmp, path)")),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, "week05", check_id, {"train.py": edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week05", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


HONEST = Path(__file__).parent / "fixtures" / "week05-honest"


@pytest.mark.parametrize("name", ["trainer_class.py", "functional_bytes.py"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, name):
    result, checks = grade_lab("week05", edits={"train.py": (HONEST / name).read_text()})
    for check in checks.values():
        expected = "passed" if machine.satisfies(check.needs) else "blocked"
        assert check.status == expected, (check.id, check.status, check.message)
    assert result.complete


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="a GPU-only mistake: needs a CUDA GPU")
def test_cuda_rng_not_restored_fails_on_the_gpu(grade_lab):
    """The CUDA generator is not restored: identical on a CPU (there is none), wrong on a GPU, where dropout draws
    from it after the resume."""
    edit = replace_once('    if rng["cuda"]:\n        torch.cuda.set_rng_state_all(rng["cuda"])\n', "")
    assert_variant_fails(grade_lab, "week05", "resume-bf16", {"train.py": edit})


CRASH_IN_THE_UNINTERRUPTED_RUN = '''

_train_as_written = train


def _deep(depth, run_dir):
    if depth:
        return _deep(depth - 1, run_dir)
    raise ValueError("the cause, at the end of a long traceback")


def train(run_dir, *args, **kwargs):
    if Path(run_dir).name == "full":  # only the grader's uninterrupted run
        _deep(60, run_dir)
    return _train_as_written(run_dir, *args, **kwargs)
'''


def test_a_crashed_run_keeps_the_end_of_its_traceback(grade_lab):
    """A driver that crashed was reported with its traceback cut at the head, so the cause (the last line) was
    lost: the message keeps the traceback's tail, whatever its length."""
    result, checks = grade_lab("week05", edits={"train.py": lambda text: text + CRASH_IN_THE_UNINTERRUPTED_RUN},
                               checks=["resume-losses"])
    check = checks["resume-losses"]
    assert check.status == "error", (check.status, check.message)
    assert "the uninterrupted run crashed" in check.message, check.message
    assert check.message.rstrip().endswith("ValueError: the cause, at the end of a long traceback"), check.message
    assert "characters left out" in check.message  # a long traceback: its middle goes, its head and tail stay


RECORDS_ITS_HOME = '''

_train_unrecorded = train


def train(run_dir, *args, **kwargs):
    import time
    (Path(run_dir) / f"home-of-{time.time_ns()}").write_text(os.environ["HOME"])
    return _train_unrecorded(run_dir, *args, **kwargs)
'''


def test_the_runs_side_by_side_have_homes_of_their_own(tmp_path):
    """Each sandbox numbers its processes from 1, so the uninterrupted run and the one killed beside it have the
    same pid: in one HOME, whatever is named by pid (a temporary file, a cache entry) would be shared by two live
    processes (an honest style's pid-named temporary file crashed a resume that way once). The grader gives the
    uninterrupted run a HOME of its own."""
    import importlib.util
    import shutil
    import sys

    root = Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("week05_resume_grader", root / "graders/week05/test_resume.py")
    grader = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = grader  # its dataclasses look their module up there
    spec.loader.exec_module(grader)
    learner = tmp_path / "learner"
    shutil.copytree(root / "labs/week05-training-resume/solution", learner)
    (learner / "train.py").write_text((learner / "train.py").read_text() + RECORDS_ITS_HOME)
    runs = grader.kill_and_resume(learner, tmp_path / "work", "cpu", "fp32", seed=5)
    assert len(runs.full.steps) == grader.STEPS and runs.resumed.steps
    homes = {name: {p.read_text() for p in (tmp_path / "work" / name).glob("home-of-*")}
             for name in (f"{grader.ALONE}/full", "interrupted")}
    assert len(homes[f"{grader.ALONE}/full"]) == 1 and len(homes["interrupted"]) == 1, homes
    assert not homes[f"{grader.ALONE}/full"] & homes["interrupted"], homes
