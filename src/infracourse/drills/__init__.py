"""Drills: the estimates 003 §9 says must be practised (fresh numbers each time, graded by formula), questions
built from the learner's own measured figures, concept questions on the topics of the interview notes (000,
002), spaced repetition, a timed mock screen, and the start self-test of 003 §1.

Modules, in the order a sitting uses them: content (the YAML files, their models, and the compiled bank a
sitting reads), formula (the arithmetic they may write), engine (an instance from a seed; grading one reply),
answers (numbers with units, and why a wrong one is wrong), schedule (what comes next), measured (the
learner's figures), session (the asking loop), selftest (the start self-test's suggestion), cli (the two
commands); record (the drill totals a submit bundle carries, and the cohort's per-topic accuracy); audit (what
`infracourse dev check` refuses).
"""
