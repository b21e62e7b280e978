"""Whether the manager that owns an attempt is gone, and the evidence that says so.

The oracle lives as long as its manager and watches every heartbeat over time: how long a
heartbeat has stayed unchanged is measured on this process's monotonic clock, which no
other node's clock (nor a wrong one here) can distort. The rule itself is leases.judge.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from httk_flow.manager.log import ManagerLog
from httk_flow.protocol.leases import FsClock, Liveness, judge, scan_heartbeats, skew_bound
from httk_flow.protocol.workspace import Workspace


class OwnerOracle:
    """Reads every heartbeat at most once per refresh period; decides on evidence only."""

    def __init__(
        self,
        ws: Workspace,
        self_id: str,
        *,
        refresh: float,
        lease: float | None = None,
        fs_clock: FsClock | None = None,
        log: ManagerLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ws = ws
        self.self_id = self_id
        self.refresh = refresh
        self.clock = clock
        self.fs_clock = fs_clock or FsClock(ws)
        self.log = log
        #: the reader's clock may differ from the filesystem's by this much and ages still count
        self.skew_bound = skew_bound(lease or ws.policy.lease)
        #: two reads further apart than this watched nothing in between (see _read)
        self.blind_gap = (lease or ws.policy.lease) * ws.policy.takeover_factor
        self._at = -1e18  # when the heartbeats were read (set back to force a read)
        self._read_at = -1e18
        self._by_id: dict[str, Liveness] = {}
        #: manager id -> (heartbeat fingerprint, our monotonic time it was first seen)
        self._seen: dict[str, tuple[tuple[int, int, int, int], float]] = {}
        self._cleared: set[str] = set()
        self._unseen: dict[str, float] = {}
        self._ages_ok: bool | None = None

    def managers(self) -> dict[str, Liveness]:
        if self.clock() - self._at >= self.refresh:
            self._read()
        return self._by_id

    def _read(self) -> None:
        fs_time = self.fs_clock.measure()
        ages = self._ages_usable(fs_time is not None)
        if fs_time is None:
            fs_time = self.fs_clock.now()
        now = self.clock()
        # after a stall of ours (or a hung filesystem, on which nobody could write) an
        # unchanged heartbeat proves nothing: everyone is watched afresh
        blind = now - self._read_at > self.blind_gap
        seen: dict[str, tuple[tuple[int, int, int, int], float]] = {}
        by_id: dict[str, Liveness] = {}
        factor = self.ws.policy.takeover_factor
        for hb in scan_heartbeats(self.ws):
            mid = hb.info.id
            prev = None if blind else self._seen.get(mid)
            since = prev[1] if prev is not None and prev[0] == hb.fingerprint else now
            seen[mid] = (hb.fingerprint, since)
            by_id[mid] = judge(
                hb,
                self.ws.host,
                fs_now=fs_time,
                use_ages=ages,
                factor=factor,
                unchanged_for=now - since,
            )
        self._seen, self._by_id = seen, by_id
        self._at = self._read_at = now

    def _ages_usable(self, probed: bool) -> bool:
        """Heartbeat ages count only while this host's clock agrees with the filesystem's;
        the change either way is said once in the log."""
        skew = self.fs_clock.skew if probed and self.fs_clock.known else None
        ok = skew is not None and abs(skew) <= self.skew_bound
        if ok != self._ages_ok and self.log is not None:
            if not ok:
                why = (
                    "no probe file can be made in the workspace"
                    if skew is None
                    else f"this host's clock differs from the shared filesystem's by "
                    f"{skew:+.1f} s (more than {self.skew_bound:g} s)"
                )
                self.log.problem(
                    "clock",
                    f"{why}: heartbeat ages are not used; a manager on another host is "
                    "taken to be gone only once its heartbeat is seen to stop changing",
                )
            elif self._ages_ok is not None:
                self.log.info("clock: this host's clock agrees with the filesystem's again")
        self._ages_ok = ok
        return ok

    def live(self) -> list[Liveness]:
        return [lv for lv in self.managers().values() if lv.alive]

    def suspects(self) -> set[str]:
        """Managers other than us that are not alive and not yet cleared of work."""
        # a manager seen alive again may die holding work later: suspect it anew then
        self._cleared -= {mid for mid, lv in self.managers().items() if lv.alive}
        return {
            mid
            for mid, lv in self.managers().items()
            if mid != self.self_id and not lv.alive and mid not in self._cleared
        }

    def clear(self, ids: set[str]) -> None:
        """A sweep found no work of these managers: stop suspecting them."""
        self._cleared |= ids

    def gone(self, owner: str | None) -> str | None:
        """Evidence that `owner` is gone ("process_gone", "stopped", "lease_expired",
        "no_heartbeat"), or None."""
        if owner is None:
            return "no_owner"
        if owner == self.self_id:
            return None
        lv = self.managers().get(owner)
        if lv is None and owner not in self._unseen:
            # no heartbeat at all: re-read once before concluding, it may be brand new
            self._at = -1e18
            lv = self.managers().get(owner)
        if lv is None:
            # a heartbeat may show up late on a shared filesystem: only an owner unseen
            # for a whole takeover grace is taken to have none
            first = self._unseen.setdefault(owner, self.clock())
            grace = self.ws.policy.lease * self.ws.policy.takeover_factor
            return "no_heartbeat" if self.clock() - first > grace else None
        self._unseen.pop(owner, None)
        return lv.evidence
