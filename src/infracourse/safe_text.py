"""Text that came from a learner (ids, names, file names, check messages, printed output), made safe to show.

A learner's string reaches an instructor's terminal (`cohort regrade`, `roster list`), a learner's own
(`grade`, `watch`, `status`) and a published site. Two things in it must never act: terminal control
characters (an ANSI or OSC escape can recolour, retitle, hide text or write a link into the terminal; a
`\\r` can overwrite a line of the table with a forged one) and rich markup (`[bold]` restyles, `[/]` with no tag
open raises and ends the command after its results were saved). `printable` removes the first; `escape` also
makes markup show as typed, for everything printed through rich. HTML is escaped by Jinja's autoescape, with
`finalize` (printable) before it, in every page made from learner data (the published site, the review app).
"""
from __future__ import annotations

import re

from rich.markup import escape as _escape_markup

# ESC sequences whole (CSI `ESC [ ... final`, OSC/DCS/APC/PM/SOS `ESC ] ... BEL or ESC \\`, two-byte `ESC x`),
# then any other C0 control but tab and newline, DEL, C1 controls, and the bidirectional overrides that make
# text read in another order than it runs ("Trojan Source").
_SEQUENCES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)|\x1b.?|\x9b[0-?]*[ -/]*[@-~]",
                        re.DOTALL)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """`text` as a string with every terminal control sequence and control character removed (tab and newline
    kept: messages have lines)."""
    return _CONTROLS.sub("", _SEQUENCES.sub("", str(text)))


def finalize(value):
    """Jinja's `finalize` for pages that show learner data: each value a template prints, `printable` (None kept
    as Jinja shows it; the templates' own HTML, a macro's or tojson's, kept as HTML)."""
    import markupsafe

    if isinstance(value, markupsafe.Markup):
        return markupsafe.Markup(printable(value))
    return value if value is None else printable(value)


def escape(text: object) -> str:
    """`printable(text)` with rich markup escaped: shown exactly as typed by anything printing through rich."""
    return _escape_markup(printable(text))
