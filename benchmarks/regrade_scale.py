"""Regrade time per bundle with 1 and 2 workers: `python benchmarks/regrade_scale.py fixture` (the generated
one-week course, 12 bundles, through cohort regrade) or `python benchmarks/regrade_scale.py real week01
week01-timing 4` (a real lab's solution graded 4 times by the runner, 1 then 2 at a time)."""
import sys, time, tempfile
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor
from infracourse.cohort import synthetic
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.regrade import regrade
from infracourse.course import Course

def fixture(n):
    out = {}
    for w in (1, 2):
        d = Path(tempfile.mkdtemp())
        course = synthetic.write_course(d / "course", weeks=1, kernel_weeks=())
        bundles = synthetic.write_cohort(course, d / "b", learners=n, missing=0)
        book = Gradebook.create(d / "g.db", course); book.import_bundles(bundles, course)
        t = time.perf_counter(); done = regrade(book, course, workers=w); out[w] = time.perf_counter() - t
        assert len(done) == n and not any(r.error for r in done)
    return out

def real(_):
    from infracourse.grading.runner import grade
    t = time.perf_counter(); r = grade(Course(Path("/work/main")), sys.argv[2], Path(f"/work/main/labs/{sys.argv[3]}/solution"))
    return time.perf_counter() - t, r.count("passed"), len(r.checks)

if sys.argv[1] == "fixture":
    n = 12; print("fixture", n, {w: (round(s, 1), round(s / n, 2)) for w, s in fixture(n).items()})
else:
    n = int(sys.argv[4])
    for w in (1, 2):
        t = time.perf_counter()
        with ProcessPoolExecutor(w) as ex: rs = list(ex.map(real, range(n)))
        total = time.perf_counter() - t
        print("real", sys.argv[2], "workers", w, "total", round(total, 1), "per bundle", round(total / n, 2), rs)
