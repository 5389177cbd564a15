"""Week 3 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week03")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week03", source="starter", stamp=False)
    assert not result.complete
    assert "build the (B, L_max) batch" in checks["schemes-correct"].message
    assert "serve the requests" in checks["littles-law"].message
    assert checks["effective-gain"].status == "failed"


SCHEMES, EXPERIMENT = "schemes.py", "experiment.py"
VARIANTS = {
    # padding positions counted as useful work
    "useful tokens counted with padding": ("utilisation-reported", EXPERIMENT, replace_once(
        "useful += sum(len(s) for s in seqs)", "useful += tokens.numel()")),
    # latency timed from when the server picked the request up: the queueing is lost
    "latency excludes queueing": ("littles-law", EXPERIMENT, replace_once(
        "latencies.append(time.perf_counter() - submitted)", "latencies.append(time.perf_counter() - started)")),
    # unpack keeps one position too many
    "unpack off by one": ("schemes-correct", SCHEMES, replace_once(
        "[logits[i, :n] for i, n in enumerate(lengths)]", "[logits[i, :n + 1] for i, n in enumerate(lengths)]")),
    # every sequence padded to the maximum length (static shapes): exact, but all the waste is back
    "pack pads to a fixed length": ("effective-gain", SCHEMES, replace_once(
        "    return torch.cat(seqs), unpack",
        "    fixed = [torch.nn.functional.pad(s, (0, 256 - len(s))) for s in seqs]\n"
        "    return torch.cat(fixed), lambda logits: [o[:n] for o, n in zip(logits.split(256), lengths)]")),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, file, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, "week03", check_id, {file: edit})
