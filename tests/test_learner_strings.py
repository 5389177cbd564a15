"""What a learner reads carries no reference to the course's internal documents or issue tracker ("003 §11",
"§10", "issue 30"): handouts, starter files, lab.yaml titles, hints and figure meanings, the syllabus, every
command's --help, `doctor --plan`, `status --completion` and the certificate."""
import re

import pytest
from typer.testing import CliRunner

from infracourse import completion
from infracourse.cli import app
from infracourse.course import Course

from conftest import REPO

INTERNAL = re.compile(r"\b\d{3} ?§|§ ?\d|\bissues? #?\d+\b", re.IGNORECASE)
COURSE = Course(REPO)


def _internal(text: str) -> list[str]:
    return [text[max(m.start() - 40, 0):m.end() + 20] for m in INTERNAL.finditer(text)]


def _learner_files() -> list:
    files = sorted(REPO.glob("labs/*/README.md"))
    for starter in sorted(REPO.glob("labs/*/starter")):
        files += [p for p in sorted(starter.rglob("*")) if p.is_file() and p.suffix in (".py", ".md", ".c", ".cu",
                                                                                          ".yaml", ".txt", ".toml")]
    return files


def _lab_texts() -> list[tuple[str, str]]:
    labs = list(COURSE.labs()) + [COURSE.lab("week24", track=t) for t in COURSE.tracks]
    texts = []
    for lab in labs:
        spec = lab.spec
        texts += [(f"{spec.week} title", spec.title), *((f"{spec.week} hint", h) for h in spec.hints)]
        texts += [(f"{spec.week}:{c.id} title", c.title) for c in spec.checks]
        texts += [(f"{spec.week} figure {f.name}", f.meaning) for f in (spec.report.figures if spec.report else [])]
    for week in COURSE.syllabus.weeks:
        texts += [(f"{week.id} syllabus", " ".join([week.title, *week.objectives, *(a.text for a in week.acceptance)]))]
    return texts


def test_the_scan_finds_what_it_looks_for():
    assert _internal("completion criteria (003 §11)") and _internal("as §10 says") and _internal("see issue 30")
    assert not _internal("a 2-stage pipeline, 30 issues of the queue, 003 bytes")


@pytest.mark.parametrize("path", _learner_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_handouts_and_starter_files(path):
    assert not _internal(path.read_text(errors="replace")), _internal(path.read_text(errors="replace"))


def test_lab_and_syllabus_texts():
    found = [(where, hit) for where, text in _lab_texts() for hit in _internal(text)]
    assert not found, found


def _invoke(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env or {}, catch_exceptions=False)


def test_command_output(tmp_path):
    env = {"INFRACOURSE_WORKSPACE": str(tmp_path / "ws")}
    assert _invoke("init", str(tmp_path / "ws")).exit_code == 0
    outputs = {"doctor --plan": _invoke("doctor", "--plan", env=env).output,
               "status --completion": _invoke("status", "--completion", "--certificate", str(tmp_path / "cert"),
                                              env=env).output}
    outputs["certificate page"] = (tmp_path / "cert" / "completion.html").read_text()
    outputs["certificate"] = completion.certificate_page(completion.certificate(COURSE, {}, learner="l", track=None))
    group = app.registered_commands
    for command in [c.name or c.callback.__name__ for c in group] + ["--help"]:
        name = command.rstrip("_")
        outputs[f"{name} --help"] = _invoke(*([name, "--help"] if name != "--help" else ["--help"])).output
    found = {what: _internal(text) for what, text in outputs.items() if _internal(text)}
    assert not found, found
