"""A token bucket per client: a client may send `burst` requests at once, and `rate` per second after that."""
from __future__ import annotations

import threading
import time


class TokenBucket:
    """Holds up to `burst` tokens, refilled continuously at `rate` per second; a request spends one.

    The clock is injected (time.monotonic by default) so that a test can move time by hand."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        self.tokens = float(burst)  # a new client may send its whole burst at once
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def allow(self) -> bool:
        """Spend a token if one is there: True (admit) or False (refuse)."""
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def retry_after(self) -> float:
        """Seconds until a token will be there (0 if one is there now)."""
        self._refill()
        return max(0.0, (1.0 - self.tokens) / self.rate)


class ClientLimiter:
    """One bucket per client id, created on the client's first request."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.buckets: dict[str, TokenBucket] = {}
        self.lock = threading.Lock()

    def check(self, client: str) -> tuple[bool, float]:
        """(admitted, seconds to wait before retrying)."""
        with self.lock:
            bucket = self.buckets.get(client)
            if bucket is None:
                bucket = self.buckets[client] = TokenBucket(self.rate, self.burst, self.clock)
            if bucket.allow():
                return True, 0.0
            return False, bucket.retry_after()
