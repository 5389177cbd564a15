"""`infracourse drill` and `selftest` start light (docs/cli-speed.md): no torch, Triton, numpy or pytest, no
grading machinery, and, once the workspace's compiled bank exists, no YAML parsing or validation of the drill
files; the bank is the same questions as the YAML, recompiled when a drill file changes, ignored when broken."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from infracourse.course import Course
from infracourse.drills import content, engine, measured

from test_cli_imports import GRADING_ONLY, HEAVY_PACKAGES, PROBE, ws  # noqa: F401 - ws: a fixture


def _probe(ws, args, extra: str = "") -> dict:
    code = PROBE.format(args=args, packages=HEAVY_PACKAGES, grading=GRADING_ONLY).replace(
        'print("PROBE"', extra + '\nprint("PROBE"')
    out = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert "PROBE " in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(out.stdout.rsplit("PROBE ", 1)[-1].splitlines()[0])


# how many times the drill files were parsed and validated in the probed process
COUNT_COMPILES = """
_content = sys.modules.get("infracourse.drills.content")
_parsed = _content._load.cache_info().misses if _content else 0
heavy = heavy + [f"compiled {_parsed} drill file(s)"] * bool(_parsed)
"""


@pytest.mark.parametrize("args", [["drill", "--json", "--seed", "3", "-n", "4"], ["selftest", "--json", "--seed", "3"]],
                         ids=lambda a: a[0])
def test_the_drill_path_imports_no_torch_and_reads_the_compiled_bank(ws, args):
    first = _probe(ws, args, COUNT_COMPILES.replace("heavy = heavy", "heavy = []"))  # compiles the bank
    assert first["code"] in (0, None) and first["heavy"], "the first sitting compiles the YAML into the bank"
    again = _probe(ws, args, COUNT_COMPILES)
    loaded = sorted({m if m.startswith("infracourse") or m.startswith("compiled") else m.split(".")[0]
                     for m in again["heavy"]})
    assert again["code"] in (0, None) and loaded == [], f"`infracourse {' '.join(args)}` loaded {loaded}"


def test_the_probe_sees_torch_and_a_compile(ws):
    """The same probe around an import of torch and a bank that has to be compiled: the check above can fail."""
    shutil.rmtree(ws / ".infracourse" / "cache", ignore_errors=True)
    probe = _probe(ws, ["drill", "--json", "--seed", "3"], "import torch\nheavy = sorted(m for m in sys.modules if "
                   f"m.split('.')[0] in {HEAVY_PACKAGES!r})" + COUNT_COMPILES)
    assert "torch" in probe["heavy"] and any(h.startswith("compiled") for h in probe["heavy"])


def test_the_bank_is_the_yaml_and_follows_its_edits(tmp_path):
    root = tmp_path / "course"
    shutil.copytree(Course().root / "curriculum" / "drills", content.drills_dir(root))
    cache = tmp_path / "cache"
    fresh = content.load(root)
    assert [q.model_dump() for q in content.bank(root, cache=cache)] == [q.model_dump() for q in fresh]
    banked = content.bank(root, cache=cache)  # from the bank now
    for q, want in zip(banked, fresh):
        for seed in (1, 2):
            a, b = engine.instantiate(q, seed, _examples(q)), engine.instantiate(want, seed, _examples(want))
            assert (a.prompt, a.expected, a.order) == (b.prompt, b.expected, b.order), q.id

    path = content.drills_dir(root) / "kernels.yaml"
    path.write_text(path.read_text().replace("id: measured-gemm-share", "id: measured-gemm-share-renamed"))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10 ** 9))
    assert "measured-gemm-share-renamed" in {q.id for q in content.bank(root, cache=cache)}, "an edit recompiles"

    (cache / "drills-course.json").write_text("{not json")
    assert len(content.bank(root, cache=cache)) == len(fresh), "a broken bank is compiled again"
    assert json.loads((cache / "drills-course.json").read_text())["questions"]


def test_a_bank_that_cannot_be_written_still_drills(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert len(content.bank(Course().root, cache=blocked)) == len(content.load(Course().root))


def _examples(q):
    return measured.examples(q) if q.kind == "measured" else None
