"""Under the Triton interpreter (no GPU) a correct kernel with small tiles is slow, not hung: each learner call
gets the check's limit plus an allowance per element of its input (runner.call_limit), and a call that does
overrun is named with its input and the interpreter's cost per program as the likely cause."""
from conftest import REPO
from minicourse import make_course

from infracourse.grading.runner import INTERPRETER_S_PER_ELEMENT, _overran, call_limit, grade

LIMIT_S = 8


def test_the_limit_grows_with_the_input_only_under_the_interpreter():
    call = {"target": "vector_ops.add", "inputs": "float32[1, 1000000], float32[1, 1000000]", "elements": 2 * 10**6}
    assert call_limit(120, call, interpreted=True) == 120 + 2 * 10**6 * INTERPRETER_S_PER_ELEMENT
    assert call_limit(120, call, interpreted=False) == 120
    assert call_limit(120, {}, interpreted=True) == 120
    message = _overran(620, call, interpreted=True)
    assert "vector_ops.add() on float32[1, 1000000], float32[1, 1000000]" in message
    assert "interpreter" in message and "small tiles" in message
    assert "interpreter" not in _overran(120, call, interpreted=False)


def _course(root):
    checks = "  - {id: warm, title: \"the worker started (torch imported) outside the timed checks\"}\n" \
             f"  - {{id: slow, title: \"many slow calls\", timeout_s: {LIMIT_S}}}\n" \
             f"  - {{id: hung, title: \"a call that never returns\", timeout_s: {LIMIT_S}}}\n"
    graders = (
        "import pytest\nimport torch\n\n\n"
        "@pytest.mark.check(\"warm\")\ndef test_warm(learner):\n    learner.module(\"probe\")\n\n\n"
        "@pytest.mark.check(\"slow\")\ndef test_slow(learner):\n"
        "    for _ in range(4):  # 4 x 3 s: longer than the check's limit, each call well inside it\n"
        "        assert learner.module(\"probe\").slow(torch.ones(100)) == 100\n\n\n"
        "@pytest.mark.check(\"hung\")\ndef test_hung(learner):\n"
        "    learner.module(\"probe\").spin(torch.ones(3, 129))\n")
    return make_course(root, checks, graders, "warm")


def test_many_slow_calls_pass_and_a_hung_one_is_named_with_its_input(tmp_path, machine):
    if machine.gpu_count:
        return  # the allowance is the interpreter's; with a GPU the check's own limit holds
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "probe.py").write_text(
        "import time\n\nimport triton  # noqa: F401 - a kernel week's file: its hang message speaks of tiles\n\n\n"
        "def slow(x):\n    time.sleep(3)\n    return int(x.sum())\n\n\n"
        "def spin(x):\n    while True:\n        pass\n")
    result = grade(_course(tmp_path / "course"), "week01", learner, hardware=machine)
    checks = {c.id: c for c in result.checks}
    assert checks["slow"].status == "passed", checks["slow"].message
    assert checks["hung"].status == "error"
    assert "probe.spin() on float32[3, 129]" in checks["hung"].message
    assert "interpreter" in checks["hung"].message


def test_the_interpreter_note_is_only_for_learner_files_that_use_triton():
    """A week-1 harness that hangs is not told about Triton tile sizes; a kernel week's is."""
    from infracourse.grading.runner import _uses_triton

    assert not _uses_triton(REPO / "labs" / "week01-timing" / "solution")
    assert _uses_triton(REPO / "labs" / "week07-triton-basics" / "solution")
