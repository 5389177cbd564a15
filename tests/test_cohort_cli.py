"""The cohort commands are thin: each passes its arguments to one function and prints what it returns
(checked with the functions replaced), and a failure is one line naming the file and the fix."""
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infracourse.cli import app
from infracourse.cohort import bundle, export, gradebook, publish, regrade, release

runner = CliRunner()


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """Replace the cohort functions with recorders; commands run in tmp_path, which has a gradebook."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gradebook.Gradebook, "__init__", lambda self, path: setattr(self, "path", Path(path)))
    seen = {}

    def recorder(name, returns):
        def record(*args, **kwargs):
            seen[name] = (args, kwargs)
            return returns
        return record

    report = gradebook.ImportReport(imported=[object()], committed=True)
    monkeypatch.setattr(gradebook.Gradebook, "import_bundles", recorder("import", report))
    monkeypatch.setattr(regrade, "regrade", recorder("regrade", []))
    monkeypatch.setattr(export, "export", recorder("export", tmp_path / "g.csv"))
    monkeypatch.setattr(publish, "publish", recorder("publish", tmp_path / "site"))
    monkeypatch.setattr(release, "release", recorder("release", release.ReleaseReport(tmp_path / "r", 3, [])))
    monkeypatch.setattr(bundle, "submit", recorder("submit", tmp_path / "week07-1.zip"))
    return seen


def run(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_each_command_passes_its_arguments_through(calls, tmp_path):
    assert run("cohort", "import", "a.zip", "b.zip", "--keep-going").exit_code == 0
    (book, paths, _course), kwargs = calls["import"]
    assert book.path == Path("gradebook.db") and list(paths) == [Path("a.zip"), Path("b.zip")] and kwargs["keep_going"]
    assert kwargs["require_roster"] and kwargs["received_at"] is None
    assert run("cohort", "regrade", "--week", "7", "--learner", "ada", "--again", "-g", "other.db").exit_code == 0
    (book, _course), kwargs = calls["regrade"]
    assert book.path == Path("other.db") and (kwargs["week"], kwargs["learner"], kwargs["again"]) == ("7", "ada", True)
    assert run("cohort", "export", "--out", "g.csv").exit_code == 0
    assert calls["export"][0][2] == Path("g.csv")
    out = run("cohort", "publish", "--out", "site", "--pseudonyms")
    assert out.exit_code == 0 and calls["publish"][0][2] == Path("site") and calls["publish"][1]["pseudonyms"]
    assert (tmp_path / "site" / "index.html").as_uri() in out.output
    assert run("release", "--out", "learner", "--course", "repo").exit_code == 0
    assert calls["release"][0] == (Path("repo"), Path("learner"))


def test_submit_prints_the_bundle_path_and_nothing_else(calls, tmp_path, monkeypatch):
    (tmp_path / "ws" / ".infracourse").mkdir(parents=True)
    (tmp_path / "ws" / ".infracourse" / "config.yaml").write_text("format_version: 1\n")
    out = runner.invoke(app, ["submit", "w7", "--learner", "ada", "--secret-file", "ada.secret"],
                        env={"INFRACOURSE_WORKSPACE": str(tmp_path / "ws")})
    assert out.exit_code == 0 and out.output == f"{tmp_path / 'week07-1.zip'}\n"
    (workspace, _course, week), kwargs = calls["submit"]
    assert workspace.root == tmp_path / "ws" and week == "w7"
    assert kwargs == {"learner": "ada", "secret_file": Path("ada.secret")}


def test_rejections_set_the_exit_code(calls, monkeypatch):
    rejected = gradebook.ImportReport(imported=[object()], committed=False,
                                      rejected=[bundle.BundleError("x.zip", "hash", "files/a.py does not match")])
    monkeypatch.setattr(gradebook.Gradebook, "import_bundles", lambda *a, **k: rejected)
    out = run("cohort", "import", "x.zip", "y.zip")
    assert out.exit_code == 1 and "rejected x.zip: files/a.py does not match" in out.output
    assert "nothing imported" in out.output and "--keep-going to record the 1 valid" in out.output


def test_failures_name_the_file_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run("cohort", "export", "--out", "grades.csv")
    assert out.exit_code == 2 and "no gradebook at gradebook.db: run `infracourse cohort init`" in out.output
    assert run("cohort", "init").exit_code == 0 and (tmp_path / "gradebook.db").is_file()
    assert "already at" in run("cohort", "init").output
    out = run("cohort", "export", "--out", "grades.xlsx")
    assert out.exit_code == 2 and "grades.xlsx: name the file .csv" in out.output
    out = run("cohort", "regrade", "--week", "99")
    assert out.exit_code == 2 and "'99' is not a week" in out.output


def test_import_expands_folders_and_quoted_globs_itself(calls, tmp_path):
    """`cohort import 'inbox/*.zip'` or `cohort import inbox/`: the shell never sees 5,000 x 24 names."""
    for name in ("b.zip", "a.zip", "sub/c.zip", "notes.txt"):
        (tmp_path / "inbox" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "inbox" / name).write_text("")
    assert run("cohort", "import", "inbox/*.zip", "--unsigned", "--received-at", "2026-02-02T10:00:00Z").exit_code == 0
    (_book, paths, _course), kwargs = calls["import"]
    assert list(paths) == [Path("inbox/a.zip"), Path("inbox/b.zip")]
    assert not kwargs["require_roster"] and kwargs["received_at"] == "2026-02-02T10:00:00Z"
    assert run("cohort", "import", "inbox").exit_code == 0
    assert list(calls["import"][0][1]) == [Path("inbox/a.zip"), Path("inbox/b.zip"), Path("inbox/sub/c.zip")]
    out = run("cohort", "import", "inbox", "--received-at", "yesterday")
    assert out.exit_code == 2 and "not a time" in out.output
