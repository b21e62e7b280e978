"""The gated launcher: the attempt's process waits on a pipe until the marker says running.

The child is /bin/sh blocked reading the gate (its stdin), in its own process group. If
the manager dies before opening the gate, the pipe's write end closes, the read fails
and the program never runs. No Python interpreter starts on this path. A program whose
#! line names bash is started as `bash PROGRAM` instead, bash sourcing the same gate
(shell/flow-gate.sh) before the program's first line: one exec instead of three.

The launcher, not posix_spawn, creates the output files (and context.json when asked):
the manager waits inside posix_spawn until the child execs, and creating inodes is the
slowest metadata operation on many filesystems, so it runs beside the manager instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

from httk_flow.protocol import layout
from httk_flow.protocol.procs import (
    boot_tick,
    group_alive,
    proc_start_time,
    process_alive,
    spawned_start_time,
)

__all__ = [
    "GATE_CLOSED",
    "NOT_EXECUTABLE",
    "NOT_FOUND",
    "LaunchedProcess",
    "group_alive",
    "launch",
    "proc_start_time",
    "process_alive",
    "read_exec_failure",
    "signal_group",
]

#: the gate of a bash program, which bash sources (as BASH_ENV) before the program: one
#: process is launcher and program. It does what _SCRIPT does: closes GATE_FD (the
#: program must not inherit it), opens the output files, writes context.json if asked,
#: enters the workdir, waits for the gate (TMOUT=0: a TMOUT of the environment must not
#: time it out; a gate closed unopened ends it before the program's first line), makes the
#: same checks of the program ($0), then unsets its variables. Every job parses it, so it
#: is terse, and its plain path ends in `return`: the failure branch after it is parsed
#: only when a check fails (hence `return` among interp's names a function must not shadow).
GATE_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shell", "flow-gate.sh"
)
#: the descriptor the bash launcher reads the gate from (the gate closes it)
GATE_FD = 9
_gate: list[int] = []


def _gate_fd() -> int | None:
    """shell/flow-gate.sh, opened once per manager (close-on-exec); None if it cannot be:
    then every attempt goes through /bin/sh."""
    if not _gate:
        try:
            _gate.append(os.open(GATE_SCRIPT, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            _gate.append(-1)
    return _gate[0] if _gate[0] >= 0 else None


#: signals Python ignores in the manager (an ignored signal stays ignored across exec, and
#: bash cannot even trap one ignored at its start): the program gets their default back,
#: as from a shell, so `producer | head` ends the producer by SIGPIPE
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
#: exit status of a launcher whose gate closed without being opened
GATE_CLOSED = 125
#: the text of the file the launcher writes: in the environment, which only the job's
#: owner can read (argv is visible to every user of the host); unset before the exec
_CONTEXT_VAR = layout.ENV_LAUNCH_CONTEXT
#: the first word of the file the launcher writes when it cannot execute the program
NOT_FOUND = "not_found"
NOT_EXECUTABLE = "not_executable"
EXEC_ERROR = "exec"  # the exec itself failed; its exit status follows (127, 126)
#: the launcher: open its output files, write context.json if given, enter the workdir,
#: wait for the gate (whose line may name the CPUs it holds), then become the program.
#: Before the exec it looks the program up with the shell's builtins (a file: executable
#: and not a directory; a name: found on PATH): one that cannot be executed is said in $5
#: and on stderr, and the launcher exits 127 or 126 as a shell does (`command exec`: a
#: redirection that fails on the special builtin exec would end sh at once, with 2). An
#: exec that fails all the same (a #! interpreter that is missing) is said in $5 by the
#: EXIT trap where the shell runs it (dash does; bash ends at once), so a program's own
#: exit 127 is never taken for the launcher's.
_SCRIPT = (
    'command exec >>"$1" 2>>"$2" || exit 126; '
    f'if [ -n "$3" ]; then printf %s "${_CONTEXT_VAR}" >"$3" || exit 126; fi; '
    f'unset {_CONTEXT_VAR}; cd -- "$4" || exit 126; _flow_x=$5; shift 5; '
    f"read -r _ _flow_c || exit {GATE_CLOSED}; _flow_w=; "
    f'[ -z "$_flow_c" ] || export {layout.ENV_CPU_LIST}="$_flow_c"; '
    'case $1 in */*) if [ -f "$1" ] && [ -x "$1" ]; then :; elif [ -e "$1" ]; '
    f"then _flow_w={NOT_EXECUTABLE}; else _flow_w={NOT_FOUND}; fi;; "
    f'*) command -v "$1" >/dev/null || _flow_w={NOT_FOUND};; esac; '
    'if [ -n "$_flow_w" ]; then echo "$_flow_w $1" >"$_flow_x"; '
    f'if [ "$_flow_w" = {NOT_FOUND} ]; then '
    'echo "flow: the program $1 was not found" >&2; exit 127; fi; '
    'echo "flow: the program $1 is not an executable file" >&2; exit 126; fi; '
    f"trap 'echo {EXEC_ERROR} $? >\"$_flow_x\"' EXIT; "
    'exec "$@" </dev/null'
)


@dataclass
class LaunchedProcess:
    """A gated child: its pid (= process group id), pidfd and the gate's write end."""

    pid: int
    start_time: int  # /proc starttime in clock ticks, to tell a reused pid apart
    gate_fd: int
    pidfd: int
    returncode: int | None = None

    def open_gate(self, cpu_list: str = "") -> bool:
        """Let the program run; False when the launcher is already gone. `cpu_list`: the
        CPUs it holds, when they were not known at its launch (launched ahead)."""
        try:
            os.write(self.gate_fd, f"go {cpu_list}\n".encode() if cpu_list else b"go\n")
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
        """The exit status (negative: killed by that signal) once the process has ended."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -255  # reaped elsewhere: the status is lost
                return self.returncode
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def close(self) -> None:
        self.close_gate()
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def launch(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    stdout: str,
    stderr: str,
    exec_failure: str,
    context: tuple[str, str] | None = None,
    bash: str | None = None,
) -> LaunchedProcess:
    """Start argv behind a closed gate, in a new process group, output to the given files.

    `context` (path, text) is a file the launcher writes before it waits on the gate;
    `exec_failure` the file it writes when it cannot execute argv[0] (read_exec_failure).
    `bash`: the bash that argv[0]'s #! line names (interp.bash_for): it is started on
    argv[0] directly, with shell/flow-gate.sh as its BASH_ENV for the gate.
    posix_spawn (vfork underneath) costs a fraction of forking the manager's address space.
    """
    ctx_path = ""
    if context is not None:
        ctx_path, env = context[0], {**env, _CONTEXT_VAR: context[1]}
    gate = _gate_fd() if bash else None
    actions: list[tuple[int, int, int]] = [(os.POSIX_SPAWN_DUP2, -1, 0)]
    if bash and gate is not None:
        # bash sources the gate before the program's first line: one exec, not three. It
        # reads it from a descriptor the manager opened at its start (/dev/fd/N), never by
        # path: an upgrade in place could remove or half-write the file, and bash runs the
        # program without a BASH_ENV it cannot read (with a warning only)
        exe, args = bash, [bash]
        actions.append((os.POSIX_SPAWN_DUP2, gate, GATE_FD))
        env = {
            **env,
            "BASH_ENV": f"/dev/fd/{GATE_FD}",
            layout.GATE_OUT: stdout,
            layout.GATE_ERR: stderr,
            layout.GATE_CTX: ctx_path,
            layout.GATE_CWD: cwd,
            layout.GATE_FAIL: exec_failure,
        }
    else:
        exe = "/bin/sh"
        args = ["/bin/sh", "-c", _SCRIPT, "flow-attempt", stdout, stderr, ctx_path, cwd]
        args.append(exec_failure)
    r, w = os.pipe()  # both ends close-on-exec; the read end is dup'ed to the gate's stdin
    actions[0] = (os.POSIX_SPAWN_DUP2, r, 0)
    before = boot_tick()
    try:
        pid = os.posix_spawn(
            exe,
            [*args, *argv],
            env,
            file_actions=actions,
            setpgroup=0,
            setsigmask=(),
            setsigdef=DEFAULT_SIGNALS,
        )
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    return LaunchedProcess(pid, spawned_start_time(pid, before) or 0, w, pidfd)


def read_exec_failure(path: str, returncode: int) -> tuple[str, bool] | None:
    """What the launcher said when it could not execute the program: NOT_FOUND or
    NOT_EXECUTABLE, and whether the exec itself failed (the program was there, but
    something it names, such as its #! interpreter, was not); None when the launcher
    said nothing: the exit status is the program's own.

    Read only for the launcher's own statuses, 127 and 126: one open per such exit."""
    if returncode not in (126, 127):
        return None
    try:
        with open(path, "rb") as fh:
            words = fh.read(4096).decode(errors="replace").split()
    except OSError:
        return None
    if not words:
        return None
    if words[0] in (NOT_FOUND, NOT_EXECUTABLE):
        return words[0], False
    if words[0] == EXEC_ERROR:
        return (NOT_FOUND if returncode == 127 else NOT_EXECUTABLE), True
    return None


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists but not ours: never claim it is gone
