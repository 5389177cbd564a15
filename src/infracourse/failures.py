"""The words a grader uses to say what it found: a check failed, or what a timed call computed was wrong.

Small and free of torch and pytest, so the CLI, the compare helpers and the worker's observers can all say it.
"""
from __future__ import annotations


class LabCheckFailed(AssertionError):
    """A check failed; the message teaches what was wrong."""


class WrongOutput(LabCheckFailed):
    """A timed check failed on what the code computed, not on how fast: measuring again cannot change it, so the
    plugin does not retry it (and does not blame a busy machine)."""

