"""How a looping reconciler is asked to stop: SIGTERM and SIGHUP end it after the pass
it is in (so its lease is released and no pass is left half done); a second signal
ends the pass at once. The wait between two passes wakes up for the signal."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from types import FrameType, TracebackType

#: the signals that stop a reconciler (SIGINT stays Python's KeyboardInterrupt)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: a second signal this soon after the first is the same request, delivered twice
REPEAT_WINDOW = 1.0


class StopNow(Exception):
    """A second stop signal: end the pass where it is."""


class StopSignals:
    """A context that turns SIGTERM/SIGHUP into a request to stop (`signum`).

    Installed only in the main thread (elsewhere signals cannot be handled, and
    `wait` is a plain sleep)."""

    def __init__(self, install: bool = True) -> None:
        self.install = install and threading.current_thread() is threading.main_thread()
        #: the first stop signal received (None: none)
        self.signum: int | None = None
        self._first = 0.0
        self._old: list[tuple[signal.Signals, object]] = []
        self._old_fd = -1
        self._r = self._w = -1
        self._armed = True

    def disarm(self) -> None:
        """From now on a second signal no longer interrupts (the pass is over)."""
        self._armed = False

    def __enter__(self) -> StopSignals:
        if self.install:
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
            self._old_fd = signal.set_wakeup_fd(self._w)
            for s in STOP_SIGNALS:
                self._old.append((s, signal.signal(s, self._on_signal)))
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if not self.install:
            return
        for s, handler in self._old:
            signal.signal(s, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._r)
        os.close(self._w)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._first = signum, now
        elif self._armed and now - self._first >= REPEAT_WINDOW:
            raise StopNow(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def wait(self, seconds: float) -> None:
        """Sleep `seconds`, or less if a stop signal comes."""
        if not self.install:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while self.signum is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # a signal writes to the wakeup pipe even when it came before the select
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                with contextlib.suppress(OSError):
                    os.read(self._r, 512)
