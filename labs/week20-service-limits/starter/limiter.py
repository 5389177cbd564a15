"""A token bucket per client: a client may send `burst` requests at once, and `rate` per second after that."""
from __future__ import annotations

import threading
import time


class TokenBucket:
    """Holds up to `burst` tokens, refilled continuously at `rate` per second; a request spends one.

    The clock is injected (time.monotonic by default): read the time only through `self.clock()`, so that the
    grader's fake clock (infracourse.kit.service_kit.FakeClock) can move time by hand."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        # TODO: the bucket's state (how many tokens it holds now, and when it was last refilled)

    def allow(self) -> bool:
        """Spend a token if one is there: True (admit) or False (refuse)."""
        raise NotImplementedError("TokenBucket.allow: refill for the time passed (capped at burst), then spend one")

    def retry_after(self) -> float:
        """Seconds until a token will be there (0 if one is there now)."""
        raise NotImplementedError("TokenBucket.retry_after: the time until the bucket holds one token")


class ClientLimiter:
    """One bucket per client id, created on the client's first request."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.buckets: dict[str, TokenBucket] = {}
        self.lock = threading.Lock()

    def check(self, client: str) -> tuple[bool, float]:
        """(admitted, seconds to wait before retrying)."""
        raise NotImplementedError("ClientLimiter.check: the client's bucket (made on first use), allow or retry_after")
