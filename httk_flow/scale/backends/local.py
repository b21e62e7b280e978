"""The local backend: manager allocations as detached processes on this host.

The default, and what laptops and tests use. A submission record written before the
process starts carries the token, so a crash between the two is found by token.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson

from httk_flow.protocol import layout
from httk_flow.protocol.fsio import atomic_write
from httk_flow.protocol.procs import proc_start_time, process_alive
from httk_flow.protocol.resources import format_size
from httk_flow.scale.backends.base import (
    AllocationProfile,
    AllocationRequest,
    BackendUnavailable,
    NodeLimits,
    Observation,
    Outcome,
    Phase,
    SubmitResult,
)


def _dir(workspace: str) -> str:
    return layout.local_allocations(workspace)


class LocalBackend:
    name = "local"
    #: the manager drains itself at the end it is given: no signal comes early
    signal_margin = 0.0

    def submit(self, request: AllocationRequest) -> SubmitResult:
        d = _dir(request.workspace)
        os.makedirs(d, exist_ok=True)
        path = layout.local_allocation_file(request.workspace, request.token)
        if os.path.exists(path):
            handle = self._handle(path)
            return SubmitResult(Outcome.EXISTING, handle)
        env = dict(os.environ)
        env[layout.ENV_ALLOCATION_TOKEN] = request.token  # the manager names it in its heartbeat
        if request.time:
            # the manager stops claiming and drains so that all ends by the walltime
            end = time.time() + max(0.0, request.time - request.drain)
            env[layout.ENV_ALLOCATION_END] = str(end)
        log_dir = request.log_dir or d
        os.makedirs(log_dir, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "httk_flow",
            "serve",
            "-w",
            request.workspace,
            # the inventory it was shaped to; the user's serve arguments come after it
            *serve_resources(request.profile),
            *request.serve_args,
        ]
        try:
            with open(os.path.join(log_dir, f"{request.token}.log"), "ab") as log:
                p = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as e:
            return SubmitResult(Outcome.REJECTED, reason=f"cannot start a manager: {e}")
        record = {
            "token": request.token,
            "pid": p.pid,
            "start_time": proc_start_time(p.pid) or 0,
            "started": time.time(),
        }
        atomic_write(path, orjson.dumps(record), durable=False)
        return SubmitResult(Outcome.CREATED, f"{p.pid}:{record['start_time']}")

    @staticmethod
    def _handle(path: str) -> str | None:
        try:
            with open(path, "rb") as fh:
                d = orjson.loads(fh.read())
            return f"{int(d['pid'])}:{int(d.get('start_time', 0))}"
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def observe(self, handles: list[str]) -> dict[str, Observation]:
        out = {}
        for h in handles:
            pid, start = _split(h)
            if pid is None:
                out[h] = Observation(Phase.UNKNOWN, "not a local handle")
            elif process_alive(pid, start):
                out[h] = Observation(Phase.RUNNING)
            else:
                _reap(pid)
                out[h] = Observation(Phase.DONE)
        return out

    def find_by_token(self, workspace: str, token: str) -> str | None:
        path = layout.local_allocation_file(workspace, token)
        if not os.path.exists(path):
            return None
        handle = self._handle(path)
        if handle is None:
            raise BackendUnavailable("its submission record is unreadable", obj=path)
        return handle

    def cancel(self, handle: str) -> None:
        pid, start = _split(handle)
        if pid is not None and process_alive(pid, start):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def diagnostics(self) -> dict[str, str]:
        return {"backend": self.name, "python": sys.executable}

    def node_limits(self) -> NodeLimits:
        """Every allocation is a process on this host: it has this host's CPUs (as this
        process may use them) and memory, on one node."""
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        try:
            mem: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            mem = None
        gpus = _host_gpus()
        sources = [("cpus", f"this host has {cpus}"), ("gpus", f"this host has {gpus}")]
        if mem:
            sources.append(("mem", f"this host has {format_size(mem)}"))
        return NodeLimits(cpus, gpus, mem or None, 1, tuple(sources))

    def allocation_id(self) -> str | None:
        # its allocations are found by their token (allocation records), not from here
        return None

    def allocation_end(self) -> float | None:
        value = os.environ.get(layout.ENV_ALLOCATION_END)
        try:
            return float(value) if value else None
        except ValueError:
            return None


def _host_gpus() -> int:
    """GPUs this host lets its processes use: CUDA_VISIBLE_DEVICES's ids, else the
    NVIDIA driver's; 0 when neither says (give --gpus-per-node then)."""
    ids = os.environ.get("CUDA_VISIBLE_DEVICES")
    if ids is not None:
        return len([x for x in ids.split(",") if x.strip() and x.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def serve_resources(profile: AllocationProfile | None) -> list[str]:
    """`flow serve` options that give a local manager the profile's inventory."""
    if profile is None:
        return []
    out = ["--cpus", str(profile.cpus)]
    if profile.mem:
        out += ["--mem", f"{max(1, -(-profile.mem // (1 << 20)))}M"]
    if profile.gpus:
        out += ["--gpus", str(profile.gpus)]
    return out


def _split(handle: str) -> tuple[int | None, int | None]:
    pid, _, start = handle.partition(":")
    try:
        return int(pid), int(start or 0)
    except ValueError:
        return None, None


def _reap(pid: int) -> None:
    # the manager may be our own child (tests, `flow scale` in the foreground)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


BACKEND = LocalBackend()
