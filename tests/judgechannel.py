"""The runner's side of one judge process, fed lines by hand: for tests of what the runner accepts from a judge
(tests/test_runner.py, tests/test_figures.py)."""
import json
from pathlib import Path

from infracourse.grading import runner

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "course"


class Channel:
    """The runner's side of one judge process: lines in, accepted results out."""

    def __init__(self, lab, settled=None, folder: Path = FIXTURE):
        self.seen = []
        self.session = runner.GradeSession(lab=lab, work=folder, snapshot=folder, env={}, settled=settled or {},
                                           on_event=self.seen.append)
        self.judge = runner.JudgeRun(known={c.id for c in lab.spec.checks})

    @property
    def newly(self):
        return self.judge.newly

    @property
    def running(self):
        return self.judge.running

    def send(self, **event):
        runner._accept(json.dumps(event).encode() if event else b"not json at all", self.session, self.judge)
