"""The learner's Triton compile cache kept between grades (runner.grade's compile_cache): the worker compiles
into it, sandboxed or not, and without one every worker gets a fresh cache in its own scratch folder."""
from pathlib import Path

from infracourse import sandbox
from infracourse.grading.protocol import COMPILE_CACHE_ENV
from infracourse.grading.remote import WorkerClient

PROBE = ("import os\n"
         "def where():\n"
         "    path = os.environ['TRITON_CACHE_DIR']\n"
         "    os.makedirs(path, exist_ok=True)\n"
         "    open(os.path.join(path, 'compiled.bin'), 'w').write('x')\n"
         "    return path\n")


def _probe(tmp_path: Path) -> str:
    folder = tmp_path / "learner"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    worker = WorkerClient(folder, gpu=False)
    try:
        return worker.module("probe").where()
    finally:
        worker.close()


def test_the_worker_compiles_into_the_kept_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(cache))
    inside = Path(_probe(tmp_path))
    if sandbox.status().available:  # bound into the worker's scratch: no host path of it shows inside
        assert inside.name == ".triton" and not inside.is_relative_to(tmp_path)
    else:
        assert inside == cache.resolve()
    assert (cache / "compiled.bin").read_text() == "x"  # written from inside the sandbox, kept after it


def test_without_a_kept_cache_each_worker_compiles_into_its_scratch(tmp_path, monkeypatch):
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    path = Path(_probe(tmp_path))
    assert path.name == ".triton" and not path.exists()  # the scratch folder went with the worker


def test_the_sandbox_binds_only_the_named_folders_writable(tmp_path):
    inside = tmp_path / "scratch" / ".triton"
    args = sandbox.wrap(["true"], snapshot=tmp_path / "snap", scratch=tmp_path / "scratch", tool="bwrap",
                        writable=((tmp_path / "cache", inside),))
    binds = [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == "--bind"]
    assert binds == [(str(tmp_path / "scratch"),) * 2, (str(tmp_path / "cache"), str(inside))]


def test_a_workspace_keeps_one_cache_per_week_outside_the_lab_folder(tmp_path):
    from infracourse.course import Course
    from infracourse.workspace import Workspace

    ws, course = Workspace.init(tmp_path / "ws"), Course()
    week = course.week("week09")
    cache = ws.compile_cache(week)
    assert cache.parent.parent == ws.meta and week.id in cache.name
    assert not cache.is_relative_to(ws.week_dir(week))
