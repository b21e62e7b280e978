"""The gated launcher: the attempt's process waits on a pipe until the marker says running.

The child is /bin/sh blocked reading the gate, in its own process group. If the manager
dies before opening the gate, the pipe's write end closes, the read fails and the
program never runs. No Python interpreter starts on this path.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass

from httk_flow.procs import proc_start_time, process_alive

__all__ = [
    "LaunchedProcess",
    "group_alive",
    "launch",
    "proc_start_time",
    "process_alive",
    "signal_group",
]

#: exit status of a launcher whose gate closed without being opened
GATE_CLOSED = 125


@dataclass
class LaunchedProcess:
    """A gated child: its pid (= process group id), pidfd and the gate's write end."""

    pid: int
    start_time: int  # /proc starttime in clock ticks, to tell a reused pid apart
    gate_fd: int
    pidfd: int
    popen: subprocess.Popen[bytes]

    def open_gate(self) -> bool:
        """Let the program run; False when the launcher is already gone."""
        try:
            os.write(self.gate_fd, b"go\n")
            return True
        except BrokenPipeError:
            return False
        finally:
            self.close_gate()

    def close_gate(self) -> None:
        if self.gate_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.gate_fd)
            self.gate_fd = -1

    def signal_group(self, sig: int) -> bool:
        """Signal the attempt's whole process group; False when it is gone."""
        return signal_group(self.pid, sig)

    def poll(self) -> int | None:
        return self.popen.poll()

    def close(self) -> None:
        self.close_gate()
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def launch(
    argv: list[str], *, cwd: str, env: dict[str, str], stdout: str, stderr: str
) -> LaunchedProcess:
    """Start argv behind a closed gate, in a new process group, output to the given files."""
    r, w = os.pipe()
    # the gate is the launcher's stdin; the program itself gets /dev/null
    script = f'read -r _ || exit {GATE_CLOSED}; exec "$@" </dev/null'
    try:
        with open(stdout, "ab") as out, open(stderr, "ab") as err:
            p = subprocess.Popen(
                ["/bin/sh", "-c", script, "flow-attempt", *argv],
                stdin=r,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                process_group=0,
            )
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    try:
        pidfd = os.pidfd_open(p.pid)
    except OSError:
        pidfd = -1
    return LaunchedProcess(p.pid, proc_start_time(p.pid) or 0, w, pidfd, p)


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists but not ours: never claim it is gone


def group_alive(pgid: int) -> bool:
    """Whether any process remains in the process group."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
