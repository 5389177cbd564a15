"""Course components shared by labs and graders: nothing here is downloaded.

In a grade's sandbox only the kit modules of the week are mounted (infracourse.kit_access); importing another
one says so, rather than only "No module named".
"""
import sys
from pathlib import Path

_WEEK = Path(__file__).with_name("_week_kit.txt")  # only in a grade's sandbox (kit_access.HANDOUT_FILE)
_HANDOUT = _WEEK.read_text(encoding="utf-8").strip() if _WEEK.is_file() else None


class _NotThisWeeksKit:
    """Asked last on sys.meta_path, so only for a kit module that is not there: an import error that names it
    and the kit the week's handout lists."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.startswith(__name__ + ".") and name.count(".") == 2:
            listed = ", ".join(f"infracourse.kit.{m}" for m in _HANDOUT.split(",") if m) or "none"
            # no `name=`: `from infracourse.kit import X` would turn it into a bare "cannot import name"
            raise ModuleNotFoundError(f"{name} is not part of this week's kit: a lab may use only the kit modules "
                                      f"its handout names (lab.yaml `kit`: {listed}); write that part yourself")
        return None


if _HANDOUT is not None and not any(isinstance(f, _NotThisWeeksKit) for f in sys.meta_path):
    sys.meta_path.append(_NotThisWeeksKit())
