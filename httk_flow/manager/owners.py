"""Whether the manager that owns an attempt is gone, and the evidence that says so."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from httk_flow.leases import Liveness, read_managers, silent_for_takeover
from httk_flow.manager.launcher import process_alive
from httk_flow.workspace import Workspace


class OwnerOracle:
    """Reads every heartbeat at most once per refresh period; decides on evidence only."""

    def __init__(
        self,
        ws: Workspace,
        self_id: str,
        *,
        refresh: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ws = ws
        self.self_id = self_id
        self.refresh = refresh
        self.clock = clock
        self._at = -1e18
        self._by_id: dict[str, Liveness] = {}
        self._cleared: set[str] = set()
        self._unseen: dict[str, float] = {}

    def managers(self) -> dict[str, Liveness]:
        if self.clock() - self._at >= self.refresh:
            self._by_id = {lv.info.id: lv for lv in read_managers(self.ws)}
            self._at = self.clock()
        return self._by_id

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
        """Evidence that `owner` is gone ("process_gone", "stopped", "lease_expired"), or None."""
        if owner is None:
            return "no_owner"
        if owner == self.self_id:
            return None
        lv = self.managers().get(owner)
        if lv is None:
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
        if lv.stopped:
            return "stopped"
        same_host = lv.info.host == self.ws.host and lv.info.pid != os.getpid()
        if same_host and not process_alive(lv.info.pid, lv.info.start_time):
            return "process_gone"
        if silent_for_takeover(lv, self.ws.policy.takeover_factor):
            return "lease_expired"
        return None
