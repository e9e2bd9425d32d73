"""A token bucket as one router sees a bucket shared with its peers.

Between syncs the router spends from its own view (refilled at the full rate) and keeps
what it spent; a sync sends that spending to Redis, where the shared bucket is refilled
by Redis's clock and debited by every router, and the reply replaces the view. Without
Redis (or while it is down) the bucket is local and holds ``share`` of the rate and burst:
1 / the routers seen at the last sync, so the fleet as a whole keeps about its limit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Bucket:
    rate: float  # per second
    burst: float
    level: float
    stamp: float  # monotonic seconds of ``level``
    share: float = 1.0  # of rate and burst, while local
    unsynced: float = 0.0  # spent since the last sync was sent

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> Bucket:
        return cls(rate, burst, burst, now)

    def _refill(self, now: float) -> None:
        cap = self.burst * self.share
        self.level = min(cap, self.level + self.rate * self.share * max(0.0, now - self.stamp))
        self.stamp = now

    def wait_s(self, amount: float, now: float) -> float:
        """0 when ``amount`` is available now, else the seconds until it will be."""
        self._refill(now)
        if self.level >= amount or self.level >= self.burst * self.share:
            return 0.0  # a request bigger than the burst passes on a full bucket
        return (amount - self.level) / (self.rate * self.share)

    def spend(self, amount: float, shared: bool) -> None:
        self.level -= amount
        if shared:
            self.unsynced += amount

    def synced(self, level: float, sent: float, now: float) -> None:
        """Redis's level after our ``sent`` spending; what we spent since stays ours."""
        self.unsynced -= sent
        self.share = 1.0
        self.level = level - self.unsynced
        self.stamp = now

    def go_local(self, share: float, now: float) -> None:
        self._refill(now)
        self.share = share
        self.unsynced = 0.0  # local limits covered it; it is not owed to the fleet
        self.level = min(self.level, self.burst * share)
