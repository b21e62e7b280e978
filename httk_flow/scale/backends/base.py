"""The allocation backend protocol: submit with a token, observe, find by token, cancel."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from httk_flow.errors import FlowError
from httk_flow.protocol.resources import format_size


class BackendUnavailable(FlowError):
    """The batch system did not answer: nothing may be concluded, no state moves."""


class Phase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"  # ended (for whatever reason) and gone
    FAILED = "failed"  # ended without ever running, or refused
    UNKNOWN = "unknown"  # the backend does not know this handle (any more)


@dataclass(frozen=True)
class AllocationProfile:
    """The shape of one allocation: how many nodes, and on each node the CPUs, GPUs and
    memory its manager serves (one manager per node)."""

    nodes: int = 1
    cpus: int = 1
    gpus: int = 0
    #: bytes per node; 0: not asked for (the batch system's default applies)
    mem: int = 0

    def describe(self) -> str:
        """As `flow allocations` shows it: `1×2 CPUs, 1G`, `2×8 CPUs, 2 GPUs, 64G`."""
        parts = [f"{self.nodes}×{self.cpus} CPU" + "s" * (self.cpus != 1)]
        if self.gpus:
            parts.append(f"{self.gpus} GPU" + "s" * (self.gpus != 1))
        if self.mem:
            parts.append(format_size(self.mem))
        return ", ".join(parts)

    def to_json(self) -> dict[str, int]:
        return {"nodes": self.nodes, "cpus": self.cpus, "gpus": self.gpus, "mem": self.mem}

    @classmethod
    def from_json(cls, data: object) -> AllocationProfile | None:
        """A stored profile; None for what is not one (a record of an older release)."""
        if not isinstance(data, dict):
            return None
        values = [data.get(k, d) for k, d in (("nodes", 1), ("cpus", 1), ("gpus", 0), ("mem", 0))]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
            return None
        nodes, cpus, gpus, mem = values
        if nodes < 1 or cpus < 1:
            return None
        return cls(nodes, cpus, gpus, mem)


@dataclass(frozen=True)
class NodeLimits:
    """The most one node of an allocation may have (None: not known), and the most nodes
    one allocation may have: the user's, or what a backend knows of its machines."""

    cpus: int | None = None
    gpus: int | None = None
    #: bytes
    mem: int | None = None
    #: the most nodes one allocation may have (None: not known, as many as asked)
    nodes: int | None = None
    #: where each figure came from, e.g. ("cpus", "--cpus-per-node 16"), for the reasons
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, what: str) -> str:
        return dict(self.sources).get(what, "the backend")


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
    #: the shape to ask for and to serve (None: the backend's defaults, detected at start)
    profile: AllocationProfile | None = None


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


def node_limits(backend: AllocationBackend) -> NodeLimits:
    """What a backend knows of the nodes its allocations get (a backend that knows defines
    `node_limits()`; the others know nothing)."""
    known = getattr(backend, "node_limits", None)
    found = known() if known is not None else None
    return found if isinstance(found, NodeLimits) else NodeLimits()


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
