"""`intra_op_threads(n)`: run a block with n torch intra-op threads, and restore the count after it.

Why the small labs need it: on a machine shared with other work (loader workers, other jobs), a second
intra-op thread is sometimes descheduled, and every parallel op then waits a scheduler time slice for it,
so a 10 us op takes milliseconds. A tiny model gains nothing from the threads and loses its steady timings.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def intra_op_threads(n: int = 1):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
