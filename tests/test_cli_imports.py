"""Commands that do not grade never load the grading machinery: no pytest, no torch or Triton, no judge, runner
or worker module (what keeps `status` and friends quick, and what a broken grader cannot break)."""
import json
import subprocess
import sys

import pytest

# Top-level packages, and infracourse.grading modules, that only grading needs (grading.results is the
# data model progress reads, so it may load).
HEAVY_PACKAGES = {"pytest", "_pytest", "pluggy", "torch", "triton", "numpy", "matplotlib"}
GRADING_ONLY = {"infracourse.grading.plugin", "infracourse.grading.fixtures", "infracourse.grading.runner",
                "infracourse.grading.remote", "infracourse.grading.worker", "infracourse.grading.protocol",
                "infracourse.grading.perf", "infracourse.grading.inputs", "infracourse.grading.plots",
                "infracourse.grading.report_check", "infracourse.bench", "infracourse.compare", "infracourse.hardware",
                "infracourse.observe", "infracourse.grading.verdicts", "infracourse.grader"}
PROBE = """import json, sys
from infracourse.cli import app
code = 0
try:
    app({args!r})
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {packages!r} or m in {grading!r})
print("PROBE", json.dumps({{"code": code, "heavy": heavy}}))
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli-imports") / "ws"
    for args in (["init", str(folder)], ["unlock", "1"]):
        subprocess.run([sys.executable, "-m", "infracourse", *args], cwd=folder.parent if args[0] == "init" else folder,
                       check=True, capture_output=True, timeout=120)
    return folder


# (`status --json` reports this machine's tier, so it probes the GPU with torch on purpose.)
@pytest.mark.parametrize("args", [["--help"], ["status"], ["next"], ["hint", "1"], ["syllabus"], ["syllabus", "1"],
                                  ["unlock", "2"], ["model", "make", "--help"]], ids=" ".join)
def test_a_command_that_does_not_grade_loads_no_grading_machinery(ws, args):
    code = PROBE.format(args=args, packages=HEAVY_PACKAGES, grading=GRADING_ONLY)
    out = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, text=True, timeout=120)
    probe = json.loads(out.stdout.rsplit("PROBE ", 1)[-1]) if "PROBE " in out.stdout else None
    assert probe is not None and probe["code"] in (0, None), out.stdout[-2000:] + out.stderr[-2000:]
    loaded = sorted({m if m.startswith("infracourse") else m.split(".")[0] for m in probe["heavy"]})
    assert loaded == [], f"`infracourse {' '.join(args)}` imported {loaded}"


def test_the_probe_sees_what_grading_loads(ws):
    """The same probe around a module the grade command loads: the check above can fail."""
    code = PROBE.format(args=["--help"], packages=HEAVY_PACKAGES, grading=GRADING_ONLY).replace(
        "from infracourse.cli import app", "from infracourse.cli import app\nimport infracourse.grading.runner")
    out = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, text=True, timeout=120)
    assert "infracourse.grading.runner" in json.loads(out.stdout.rsplit("PROBE ", 1)[-1])["heavy"]
