"""The allocation backend protocol: submit with a token, observe, find by token, cancel."""

from __future__ import annotations

import enum
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
