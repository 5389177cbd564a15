"""For instructors: release the course without solutions, collect submissions, grade a cohort, publish it.

One concept per module, in the order a term runs:
  release    a learner copy of the course repository with no reference solution in it
  bundle     the submission a learner hands in (`infracourse submit`), and its validation
  gradebook  the instructor's SQLite store of submissions and their self-reported and verified results
  regrade    re-running the graders on the instructor's machine, in workers here or a Slurm job array (slurm)
  outcome    grading one submission wherever it runs; where verified and self-reported disagree
  standing   what a learner x week stands at: the one reading of the gradebook that export and publish share
  export     CSV / JSON, one row per learner x week
  publish    the static cohort site (grid, week pages, leaderboards), viewable from file://
  rubric     hand scores of the reasoning in reports, read against each week's rubric in lab.yaml
  review     the local web app instructors score in (`cohort review`); review_page is what it shows
  feedback   the learner's scores and comments, published signed for them (`infracourse feedback`)
  synthetic  a generated course and cohort for previews, tests and the benchmark
"""
