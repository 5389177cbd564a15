"""README's test tiers select what they say: `-m variant` is every test that grades a known-wrong variant
(tests/conftest.py marks them as they are collected, before `-m` selects), and `-m "not variant"` leaves them out."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def collected(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/test_week21.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_variant_selects_the_variant_proofs_and_not_variant_leaves_them_out():
    variants, others = collected("-m", "variant"), collected("-m", "not variant")
    assert "tests/test_week21.py::test_wrong_variant_fails_its_check[retry that executes twice]" in variants
    assert "tests/test_week21.py::test_a_supervisor_that_restarts_once_fails_at_the_second_kill" in variants
    assert "tests/test_week21.py::test_solution_passes_every_check_this_machine_can_run" in others
    assert not variants & others and variants | others == collected()
