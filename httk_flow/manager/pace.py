"""How long an idle manager sleeps between two ticks when nothing wakes it.

Every tick walks each state's directories: a fleet of idle managers on a shared
filesystem pays for every one, so a manager with nothing to do and nothing running looks
less often, and new work waits at most IDLE_SLEEP for it.
"""

from __future__ import annotations

#: idle ticks at the poll interval before the sleep grows, and the longest sleep then (s)
IDLE_TICKS = 10
IDLE_SLEEP = 2.0


class IdlePace:
    """The poll interval, doubled after each further idle tick once there were IDLE_TICKS
    in a row, up to IDLE_SLEEP and a quarter of the lease (heartbeats stay fresh)."""

    def __init__(self, poll_interval: float, lease: float) -> None:
        self.poll_interval = poll_interval
        self.longest = max(poll_interval, min(IDLE_SLEEP, lease / 4))
        #: ticks in a row with nothing done and nothing running
        self.idle_ticks = 0

    def after(self, idle: bool) -> float:
        """Seconds to sleep after a tick (`idle`: it did nothing, and nothing runs here)."""
        if not idle:
            self.idle_ticks = 0
            return self.poll_interval
        self.idle_ticks += 1
        doublings = self.idle_ticks - IDLE_TICKS
        if doublings <= 0:
            return self.poll_interval
        return min(self.longest, self.poll_interval * 2.0 ** min(doublings, 8))
