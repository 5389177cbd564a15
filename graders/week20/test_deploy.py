"""Deploying it: another person runs the one command DEPLOY.md names from a clean copy of your files; the
Dockerfile pins what it builds on; where a container engine runs, the image is built and answers its probes."""
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from infracourse.grader import LabCheckFailed, launch, server_environment, serving
from infracourse.kit import service_kit as sk
from week20_judging import FILES, JUDGE_CFG, expect_tokens, teach_from_log

RUN_BLOCK = re.compile(r"^```[ \t]*(?:sh|bash|shell)[ \t]+run[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def run_command(deploy: Path) -> str:
    """The one command of DEPLOY.md's ```sh run block."""
    if not deploy.exists():
        raise LabCheckFailed("DEPLOY.md is missing: write the instructions another person follows, with the one "
                             "command that runs the service in a fenced block opened by ```sh run")
    blocks = RUN_BLOCK.findall(deploy.read_text(errors="replace"))
    lines = [x.strip() for b in blocks for x in b.splitlines() if x.strip() and not x.strip().startswith("#")]
    if len(blocks) != 1 or len(lines) != 1:
        raise LabCheckFailed(f"DEPLOY.md has {len(blocks)} ```sh run block(s) holding {len(lines)} command line(s); "
                             "put exactly one command (e.g. ./run.sh) in one fenced block opened by ```sh run")
    return lines[0]


def clean_copy(root: Path, into: Path) -> list[str]:
    """Only the lab's files, with their modes (run.sh stays executable); the names that were there."""
    have = []
    for name in FILES:
        if (root / name).exists():
            shutil.copy2(root / name, into / name)
            have.append(name)
    return have


@pytest.mark.check("local-run")
def test_local_run_from_clean_copy(learner, judge_model, seed, device):
    command = run_command(learner.path("DEPLOY.md"))
    folder = Path(tempfile.mkdtemp(prefix="w20-deploy-", dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        clean_copy(learner.root, folder)
        uds = folder / serving.SOCKET_NAME
        env = server_environment(folder, device, {**JUDGE_CFG.to_env(), "SERVICE_UDS": str(uds)})
        # confined; its output cut past the launch's output limit, the command's session killed
        proc = launch.start(["bash", "-c", command], scratch=folder, env=env, log=folder / serving.LOG_NAME)
        server = serving.Server(str(uds), proc, proc.capture.path, captured=proc.capture)
        what = (f"`{command}` (DEPLOY.md's run block), run in a fresh folder holding only your files "
                f"({', '.join(FILES)}) with SERVICE_UDS={uds}")
        try:
            began, ready = time.perf_counter(), None
            while time.perf_counter() - began < 60:
                if not server.alive():
                    raise LabCheckFailed(teach_from_log(server.log_tail(20000), f"{what}: it exited (code "
                                         f"{proc.returncode}) before /ready said 200; the end of its output:\n"
                                         f"{server.log_tail(1500)}"))
                if uds.exists():
                    a = sk.call(str(uds), "GET", "/ready", timeout_s=2)
                    if a.status == 200:
                        ready = time.perf_counter() - began
                        break
                time.sleep(0.1)
            if ready is None:
                raise LabCheckFailed(f"{what}: no 200 from GET /ready on the Unix socket $SERVICE_UDS within 60 s "
                                     f"(socket {'there' if uds.exists() else 'never created'}); the run command must "
                                     f"serve on $SERVICE_UDS when it is set. Its output:\n{server.log_tail(1500)}")
            prompt = sk.prompts(1, seed + 11)[0]
            a = sk.complete(str(uds), prompt, 6, client="deployer")
            expect_tokens(judge_model, a, prompt, 6, f"{what}: a completion once ready")
        finally:
            serving.stop(server)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- the Dockerfile ---------------------------------------------------------------------------------------------

def _logical_lines(text: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        out.append((current + line).strip())
        current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _image_pinned(ref: str) -> bool:
    if "@sha256:" in ref:
        return True
    name = ref.rsplit("/", 1)[-1]
    if ":" not in name:
        return False
    tag = name.split(":", 1)[1]
    return tag != "latest" and bool(re.search(r"\d", tag))


REQ_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?\s*===?\s*[0-9][^\s;,]*(\s*;.*)?$")


def _unpinned_requirements(text: str) -> list[str]:
    bad = []
    for raw in text.splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#") or line.startswith("-"):
            continue
        if not REQ_PIN.match(line):
            bad.append(line)
    return bad


def _pip_packages(instruction: str) -> list[str]:
    """The package arguments of each `pip install` in a RUN instruction (options and -r files left out)."""
    packages = []
    for segment in re.split(r"&&|;|\|\|", instruction):
        try:
            words = shlex.split(segment)
        except ValueError:
            words = segment.split()
        if "install" not in words or not any(w.endswith("pip") or w.endswith("pip3") for w in words):
            continue
        rest = words[words.index("install") + 1:]
        skip = False
        for w in rest:
            if skip:
                skip = False
                continue
            if w in ("-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url",
                     "-f", "--find-links", "--target", "-t", "--prefix", "--root"):
                skip = True
                continue
            if w.startswith("-") or w.startswith("/") or w.startswith("."):
                continue
            packages.append(w)
    return packages


@pytest.mark.check("dockerfile-pinned")
def test_dockerfile_pinned(learner):
    path = learner.path("Dockerfile")
    if not path.exists():
        raise LabCheckFailed("Dockerfile is missing: write the image's recipe (FROM a pinned base, install the "
                             "pinned requirements, copy the service, CMD its run command)")
    lines = _logical_lines(path.read_text(errors="replace"))
    args = {}
    for line in lines:
        if line.upper().startswith("ARG "):
            name, _, default = line[4:].strip().partition("=")
            args[name.strip()] = default.strip().strip('"')
    stages, froms = set(), []
    for line in lines:
        if line.upper().startswith("FROM "):
            words = [w for w in line.split()[1:] if not w.startswith("--")]
            ref = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0]) if words else ""
            froms.append(ref)
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
    if not froms:
        raise LabCheckFailed("Dockerfile has no FROM line: start from a base image pinned to a version")
    loose = [r for r in froms if r.lower() not in stages and r.lower() != "scratch" and not _image_pinned(r)]
    if loose:
        raise LabCheckFailed(f"Dockerfile builds FROM {loose[0]!r}: a tag like `latest` (or none) moves under you, "
                             "so the same Dockerfile builds a different image next month. Pin a version tag "
                             "(python:3.11.9-slim-bookworm) or a digest (@sha256:...)")
    unpinned = []
    for line in lines:
        if line.upper().startswith("RUN "):
            unpinned += [p for p in _pip_packages(line[4:]) if "==" not in p and "@" not in p]
    if unpinned:
        raise LabCheckFailed(f"Dockerfile installs {unpinned[:3]} without a version: pin each package (name==x.y.z) "
                             "in requirements.txt and install with -r requirements.txt")
    req = learner.path("requirements.txt")
    if not req.exists():
        raise LabCheckFailed("requirements.txt is missing: list the service's packages, each pinned (name==x.y.z)")
    bad = _unpinned_requirements(req.read_text(errors="replace"))
    if bad:
        raise LabCheckFailed(f"requirements.txt has {bad[:3]} not pinned to one version; write name==x.y.z for each "
                             "(pip freeze shows the versions you tested with)")
    if not any(line.upper().startswith(("CMD ", "ENTRYPOINT ")) for line in lines):
        raise LabCheckFailed("Dockerfile has no CMD or ENTRYPOINT: the image must start the service by itself")


# --- the image (a container engine) -----------------------------------------------------------------------------

def _engine() -> str:
    for tool in ("docker", "podman"):
        if shutil.which(tool):
            return tool
    raise LabCheckFailed("no docker or podman on PATH")


@pytest.mark.check("image-build")
def test_image_builds_and_answers(learner, seed, judge_model):
    import infracourse

    tool = _engine()
    tag = f"infracourse-week20:{seed % 100000}"
    context = Path(tempfile.mkdtemp(prefix="w20-image-"))
    name = f"infracourse-week20-{seed % 100000}"
    try:
        clean_copy(learner.root, context)
        (context / "course").mkdir()
        shutil.copytree(Path(infracourse.__file__).parent, context / "course" / "infracourse",
                        ignore=shutil.ignore_patterns("__pycache__"))
        built = subprocess.run([tool, "build", "-t", tag, str(context)], capture_output=True, text=True, timeout=800)
        if built.returncode:
            raise LabCheckFailed(f"`{tool} build` of a clean copy (your files, the course package in ./course) failed:"
                                 f"\n{(built.stdout + built.stderr)[-1500:]}")
        run = subprocess.run([tool, "run", "-d", "--name", name, "-p", "127.0.0.1::8000", tag], capture_output=True,
                             text=True, timeout=60)
        if run.returncode:
            raise LabCheckFailed(f"`{tool} run` of the image failed: {(run.stdout + run.stderr)[-800:]}")
        port = subprocess.run([tool, "port", name, "8000"], capture_output=True, text=True, timeout=30).stdout
        address = port.strip().splitlines()[0].strip() if port.strip() else ""
        began, health, ready = time.perf_counter(), 0, 0
        while time.perf_counter() - began < 90 and ready != 200:
            health = sk.call(address, "GET", "/health", timeout_s=2).status if address else 0
            ready = sk.call(address, "GET", "/ready", timeout_s=2).status if address else 0
            time.sleep(0.5)
        if health != 200 or ready != 200:
            logs = subprocess.run([tool, "logs", name], capture_output=True, text=True, timeout=30)
            raise LabCheckFailed(f"the container (port 8000 published on {address or 'nothing'}) answered /health "
                                 f"{health}, /ready {ready} after 90 s; its log:\n{(logs.stdout + logs.stderr)[-1200:]}")
        prompt = sk.prompts(1, seed + 13)[0]
        expect_tokens(judge_model, sk.complete(address, prompt, 6, client="image"), prompt, 6,
                      "a completion from the container")
    finally:
        subprocess.run([tool, "rm", "-f", name], capture_output=True, timeout=60)
        shutil.rmtree(context, ignore_errors=True)
