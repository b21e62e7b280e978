"""Manager log lines: one per transition, as text or as one JSON object a line; and the
reporter hook a live display (`flow run` on a terminal) is fed through.

The transition lines are not written by hand: `ManagerLog.observe` is installed as the
workspace's transition observer, so every move the manager makes is logged exactly once.
With a reporter, the lines go to it instead of the stream, and only the ones worth
keeping in a terminal's scrollback: failures, problems and the manager's own news.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol.counting import count_markers
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.frames import Frame
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

#: seconds between two reports to a reporter (it draws each one)
REPORT_EVERY = 0.25
#: the shortest time between two counts of the workspace's markers (the manager's own
#: moves are applied in between: a count only catches up with other actors'); a count that
#: took long is spaced out further, so that counting takes at most COUNT_SHARE of the time
COUNT_EVERY = 2.0
COUNT_SHARE = 0.02
#: running jobs a report names at most (this manager's first)
ROWS = 8


@dataclass(frozen=True)
class RunningJob:
    key: str
    #: seconds since its attempt started
    elapsed: float
    #: the manager running it
    manager: str


@dataclass(frozen=True)
class Progress:
    """One report to a reporter: the workspace's counts and this manager's own numbers."""

    manager: str
    workspace: str
    workers: int
    #: seconds since the manager began
    elapsed: float
    #: every job of the workspace by state: counted from marker names every few seconds,
    #: moved on by this manager's own transitions in between
    counts: Mapping[State, int]
    #: jobs this manager ran that ended succeeded, failed; attempts it started
    succeeded: int
    failed: int
    attempts: int
    #: up to ROWS running jobs, this manager's first (others' as of the last count)
    running: tuple[RunningJob, ...]
    draining: bool
    #: the last report: the manager is stopping, its summary lines come next
    final: bool = False


class Reporter(Protocol):
    """What a live display implements to be fed by a manager (`Manager(reporter=...)`)."""

    def line(self, text: str) -> None:
        """One log line worth keeping: a failure, a problem, the manager's news."""

    def progress(self, progress: Progress) -> None:
        """The manager's progress, at most every REPORT_EVERY seconds and once at the end."""


class ManagerLog:
    """The one producer of a manager's lines. `enabled=False` (`--quiet`) keeps problems
    and the summary a manager ends with; a `reporter` takes the lines instead of the
    stream, and of the transitions only the moves to failed (its display shows the rest)."""

    def __init__(
        self,
        manager_id: str,
        fmt: str = "text",
        stream: IO[str] | None = None,
        enabled: bool = True,
        reporter: Reporter | None = None,
    ) -> None:
        self.id = manager_id
        self.fmt = fmt
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.reporter = reporter

    def _emit(self, event: str, fields: dict[str, Any], text: str, always: bool = False) -> None:
        # quiet managers still report problems: a broken job must never go unmentioned
        if not self.enabled and event != "problem" and not always:
            return
        now = time.time()
        if self.fmt == "json":
            line = orjson.dumps(
                {"t": round(now, 3), "manager": self.id, "event": event, **fields}
            ).decode()
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(now))
            line = f"{stamp} {self.id} {text}"
        if self.reporter is not None:
            self.reporter.line(line)
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed log never stops the manager

    def transition(self, key: str, src: str, dst: str, why: str = "") -> None:
        self._emit(
            "transition",
            {"job": key, "from": src, "to": dst, "why": why},
            f"{key} {src} -> {dst}" + (f" ({why})" if why else ""),
        )

    def observe(self, old: JobHandle, new: JobHandle, frame: Frame, note: str | None) -> None:
        """The workspace's transition observer: one line for the move just made.

        Its reason is the caller's note, else the frame's `why`; a move to failed also
        names the failure code (`fail: bad_input`), the word an operator searches for.
        """
        if not self.enabled or (self.reporter is not None and new.state is not State.FAILED):
            return
        failure = frame.body.failure
        code = failure.code if failure is not None else None
        why = note if note is not None else frame.body.why or ""
        if new.state is State.FAILED and code and code != why:
            why = f"{why}: {code}" if why else code
        self.transition(old.key, old.state.value, new.state.value, why)

    def info(self, message: str, **fields: Any) -> None:
        self._emit("info", {"message": message, **fields}, message)

    def summary(self, message: str) -> None:
        """The line a manager ends with: an info line, said even when quiet."""
        self._emit("info", {"message": message}, message, always=True)

    def problem(self, obj: str, message: str) -> None:
        self._emit("problem", {"object": obj, "message": message}, f"problem: {obj}: {message}")


class ProgressFeed:
    """What a reporter is shown, kept cheap for the manager: the workspace's jobs counted
    by marker name alone every COUNT_EVERY seconds at most (and no more often than keeps
    counting under COUNT_SHARE of the time), moved on in between by the transitions this
    manager makes (`observe`, a transition observer); its own numbers as the loop hands
    them; and the running jobs of other managers, read from their running frames when
    counted."""

    def __init__(
        self,
        ws: Workspace,
        manager_id: str,
        workers: int,
        reporter: Reporter,
        *,
        rows: int = ROWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ws = ws
        self.id = manager_id
        self.workers = workers
        self.reporter = reporter
        self.rows = rows
        self.clock = clock
        self.started = clock()
        self.counts: dict[State, int] = dict.fromkeys(State, 0)
        self._next_report = -1e18
        self._next_count = -1e18
        #: other managers' running jobs at the last count: (key, started, manager)
        self._others: list[tuple[str, float, str]] = []

    def observe(self, old: JobHandle, new: JobHandle, frame: Frame, note: str | None) -> None:
        if self.counts[old.state] > 0:
            self.counts[old.state] -= 1
        self.counts[new.state] += 1

    def due(self) -> bool:
        return self.clock() >= self._next_report

    def send(
        self,
        *,
        succeeded: int,
        failed: int,
        attempts: int,
        running: list[tuple[str, float]],
        draining: bool,
        final: bool = False,
    ) -> None:
        """Report now: `running` is this manager's (key, seconds running) of each attempt."""
        now = self.clock()
        self._next_report = now + REPORT_EVERY
        own = [RunningJob(key, elapsed, self.id) for key, elapsed in running[: self.rows]]
        mine = {key for key, _ in running}
        if final or now >= self._next_count:
            self._count(mine, self.rows - len(own))
            took = self.clock() - now
            self._next_count = now + max(COUNT_EVERY, took / COUNT_SHARE)
        wall = time.time()
        others = [
            RunningJob(key, max(0.0, wall - t), manager)
            for key, t, manager in self._others
            if key not in mine
        ]
        self.reporter.progress(
            Progress(
                manager=self.id,
                workspace=self.ws.root,
                workers=self.workers,
                elapsed=now - self.started,
                counts=dict(self.counts),
                succeeded=succeeded,
                failed=failed,
                attempts=attempts,
                running=tuple(own + others[: self.rows - len(own)]),
                draining=draining,
                final=final,
            )
        )

    def _count(self, mine: set[str], rows: int) -> None:
        self.counts = {st: count_markers(self.ws, st) for st in State}
        self._others = []
        if rows <= 0 or self.counts[State.RUNNING] <= len(mine):
            return
        walk = walk_all(self.ws, State.RUNNING)
        try:
            for h in walk:
                if h.key in mine:
                    continue
                try:
                    frame = self.ws.reader.frame(h.marker.ref)
                except (FlowError, OSError):
                    continue  # moved on, or unreadable: the next count sees it
                self._others.append((h.key, frame.t, frame.by))
                if len(self._others) >= rows:
                    break
        finally:
            close = getattr(walk, "close", None)
            if close is not None:
                close()  # a walk left early gives its directory handles back now
