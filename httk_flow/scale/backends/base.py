"""The allocation backend protocol: submit with a token, observe, find by token, cancel."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from httk_flow.errors import FlowError


class BackendUnavailable(FlowError):
    """The batch system did not answer: nothing may be concluded, no state moves."""


class Phase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"  # ended (for whatever reason) and gone
    FAILED = "failed"  # ended without ever running, or refused
    UNKNOWN = "unknown"  # the backend does not know this handle (any more)


@dataclass(frozen=True)
class AllocationRequest:
    """One manager allocation: the workspace, the token, and how to run `flow serve`."""

    workspace: str
    token: str
    serve_args: tuple[str, ...] = ()
    time: float | None = None  # seconds of walltime; None = the backend's default
    drain: float = 120.0  # seconds before the end at which the manager is told to drain
    extra_args: tuple[str, ...] = ()  # backend-specific submission arguments
    log_dir: str | None = None
    #: how much earlier than `drain` the batch system may signal; None: the backend's own
    margin: float | None = None


class Outcome(enum.Enum):
    CREATED = "created"
    EXISTING = "existing"  # a submission with this token is already there
    REJECTED = "rejected"  # a definite no, with a reason
    UNKNOWN = "unknown"  # no definite answer: the next step must ask by token


@dataclass(frozen=True)
class SubmitResult:
    outcome: Outcome
    handle: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Observation:
    phase: Phase
    reason: str = ""
    detail: dict[str, str] = field(default_factory=dict)


class AllocationBackend(Protocol):
    name: str
    #: seconds by which the drain signal may come earlier than asked
    signal_margin: float

    def submit(self, request: AllocationRequest) -> SubmitResult: ...

    def observe(self, handles: list[str]) -> dict[str, Observation]:
        """The phase of each handle; raises BackendUnavailable when the system is down."""
        ...

    def find_by_token(self, workspace: str, token: str) -> str | None:
        """The handle of the allocation submitted with this token, None if there is none.

        Raises BackendUnavailable rather than answer None without knowing."""
        ...

    def cancel(self, handle: str) -> None:
        """Ask the allocation's manager to drain and end (idempotent)."""
        ...

    def diagnostics(self) -> dict[str, str]: ...

    def allocation_end(self) -> float | None:
        """If this process runs inside one of this backend's allocations: its end time."""
        ...

    def allocation_id(self) -> str | None:
        """If this process runs inside one of this backend's allocations: its id, from the
        environment alone (nothing is asked of the batch system)."""
        ...


def adopt_by_token(
    backend: AllocationBackend,
    workspace: str,
    token: str,
    wait: float,
    *,
    every: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """After a submission without a definite answer: ask for its token every `every`
    seconds for `wait` seconds; the handle, or None (never seen, or never answered)."""
    deadline = clock() + wait
    while True:
        try:
            found = backend.find_by_token(workspace, token)
        except BackendUnavailable:
            found = None
        if found is not None or clock() >= deadline:
            return found
        sleep(every)


@dataclass(frozen=True)
class Submitted:
    """One allocation submitted by hand: the backend's handle, its token and its log."""

    handle: str
    token: str
    workspace: str
    log: str


class SubmitOne(Protocol):
    def __call__(
        self,
        workspace: str,
        *,
        serve_args: tuple[str, ...],
        time: float | None,
        drain: float,
        extra_args: tuple[str, ...],
        margin: float | None = None,
    ) -> Submitted:
        """Submit one manager allocation; a FlowError says why not (or that it is unknown)."""
        ...


@dataclass(frozen=True)
class BackendCommand:
    """A command a backend adds to `flow`, as plain data (the CLI builds the command):
    `flow NAME [ARG_FLAG ARG]... [--time D] [--drain D] [--json] [-- SERVE_OPTIONS]`
    submits one manager allocation and prints its handle."""

    name: str
    #: the command's help: a first line, a blank line, then the details
    help: str
    #: the repeatable option whose values go to the batch system as they are
    arg_flag: str
    arg_help: str
    submit: SubmitOne
    #: seconds by which this batch system may signal the drain earlier than asked
    signal_margin: float = 0.0
