"""A manager's drain: when it stops claiming, and whether it also stops what runs.

Three things start one: a signal (the batch system's walltime TERM, a user's ^C), the
walltime the manager was given, and a node on which attempts cannot be started. The first
two stop the running attempts (they go back to ready); the third lets them run on, until
a signal or the walltime asks for more. A second signal, not a repeat, means exit now.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType

from httk_flow.manager.local import LocalAttempts
from httk_flow.manager.log import ManagerLog

#: a second SIGTERM this soon after the first is the batch system repeating itself
REPEAT_SIGNAL_WINDOW = 1.0


class Drain:
    def __init__(
        self,
        log: ManagerLog,
        local: LocalAttempts,
        heartbeat: Callable[[bool], None],
        note: Callable[[str], str | None],
    ) -> None:
        """`heartbeat(force)` says the drain to other managers; `note(signal name)` is the
        line to log beside the batch system's own when a signal starts the drain."""
        self._log = log
        self._local = local
        self._heartbeat = heartbeat
        self._note = note
        #: no new claims
        self.active = False
        #: the running attempts are being stopped (not only no new claims)
        self.stops = False
        #: a second signal: kill what runs and exit, the leases recover the rest
        self.exit_now = False
        self._started = 0.0
        self._signals: list[float] = []

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._signals and now - self._signals[-1] < REPEAT_SIGNAL_WINDOW:
            return  # a batch system may deliver its walltime TERM twice within milliseconds
        self._signals.append(now)
        if len(self._signals) == 1:
            name = signal.Signals(signum).name
            self.begin(f"signal {name}")
            if note := self._note(name):
                self._log.info(note)  # beside the batch system's own line about the signal
        else:
            self.exit_now = True

    def begin(self, why: str, *, stop_running: bool = True) -> None:
        """No more claims; stop what runs unless not `stop_running` (until a later call)."""
        if self.stops or (self.active and not stop_running):
            return
        self.active = True
        n = len(self._local)
        if stop_running:
            self.stops = True
            self._started = time.monotonic()
            self._log.info(f"draining ({why}): no new claims; stopping {n} attempt(s)")
            self._local.stop_all(interrupted=True)
        else:
            self._log.info(f"draining ({why}): no new claims; {n} attempt(s) run on")
        self._heartbeat(True)

    def overdue(self, timeout: float) -> bool:
        """Whether the attempts being stopped have had `timeout` seconds to end."""
        return self.stops and time.monotonic() - self._started > timeout
