"""Allocation backends: how manager allocations are submitted, observed and cancelled.

The core names no batch system. Backends are the modules and packages of this package
that define BACKEND; they are found by listing the package, not by name.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Mapping, MutableMapping
from functools import cache
from types import ModuleType
from typing import cast

from httk_flow.errors import UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.resources import NO_GRANT, Grant
from httk_flow.scale.backends.base import AllocationBackend, BackendCommand


@cache
def available() -> dict[str, AllocationBackend]:
    """Every backend this installation ships, by name."""
    found: dict[str, AllocationBackend] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        backend = getattr(mod, "BACKEND", None)
        if backend is not None:
            found[backend.name] = backend
    return found


def commands() -> list[BackendCommand]:
    """Commands backends add to `flow`, as plain descriptions (each module's COMMANDS)."""
    out: list[BackendCommand] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        out.extend(getattr(mod, "COMMANDS", []))
    return out


def submit_arg_flags() -> list[str]:
    """Option names backends give to their submission arguments (SUBMIT_ARG_FLAGS)."""
    flags: list[str] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            mod = importlib.import_module(f"{__name__}.{info.name}")
            flags.extend(getattr(mod, "SUBMIT_ARG_FLAGS", []))
    return flags


def get(name: str) -> AllocationBackend:
    backends = available()
    if name not in backends:
        raise UsageError(
            f"is not a backend; choose one of {', '.join(sorted(backends))}",
            obj=f"backend {name!r}",
        )
    return backends[name]


def current_allocation() -> tuple[float, float] | None:
    """When the allocation this process runs in ends (unix time), if a backend can tell,
    and how much earlier than asked that backend may signal its drain (its margin)."""
    for backend in available().values():
        end = backend.allocation_end()
        if end is not None:
            return end, backend.signal_margin
    return None


def current_grant(environ: Mapping[str, str] | None = None) -> Grant:
    """What the batch system this process runs in granted it on this node (CPUs, memory,
    GPUs), as the first backend that knows says; NO_GRANT outside one."""
    env = os.environ if environ is None else environ
    for mod in _modules():
        read = getattr(mod, "GRANT", None)
        found = read(env) if read is not None else None
        if found is not None:
            return cast(Grant, found)
    return NO_GRANT


def _modules() -> list[ModuleType]:
    """The backend modules and packages of this package (not base)."""
    return [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if info.name != "base"
    ]


def current_allocation_end() -> float | None:
    """When the allocation this process runs in ends (unix time), if a backend can tell."""
    found = current_allocation()
    return found[0] if found is not None else None


def current_job() -> tuple[str, str] | None:
    """The batch job this process runs in, if a backend can tell without asking its
    scheduler: its name for people, and the line the batch system writes into the job's
    output when it signals the job (a backend that can say defines `current_job`)."""
    for backend in available().values():
        find: Callable[[], tuple[str, str] | None] | None = getattr(backend, "current_job", None)
        found = find() if find is not None else None
        if found is not None:
            return found
    return None


def current_allocation_id() -> tuple[str, str] | None:
    """(backend name, id) of the allocation this process runs in, if a backend can tell
    from the environment alone."""
    for backend in available().values():
        ident = backend.allocation_id()
        if ident is not None:
            return backend.name, ident
    return None


def export_allocation_id(environ: MutableMapping[str, str] = os.environ) -> None:
    """Name the allocation this process runs in for the manager it is about to become
    ($FLOW_ALLOCATION_ID, BACKEND:ID, which its heartbeat carries): the one a backend
    recognises, else whatever a batch script exported itself."""
    found = current_allocation_id()
    if found is not None:
        environ[layout.ENV_ALLOCATION_ID] = f"{found[0]}:{found[1]}"
