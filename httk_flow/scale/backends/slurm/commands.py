"""Running Slurm's client commands: always with a timeout, always into a typed result.

This module is the subprocess boundary of the backend. It never decides what an answer
means for an allocation; it only says whether the controller answered at all.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from httk_flow.scale.backends.base import BackendUnavailable

#: seconds a query (squeue, scontrol, scancel, sinfo) may take before we stop waiting
QUERY_TIMEOUT = 45.0
#: seconds sbatch may take; a submission that times out has an unknown result
SUBMIT_TIMEOUT = 90.0

#: what the clients print when the controller did not answer (lower case); an answer
#: like this says nothing about any job, so it must never be read as "not found"
UNREACHABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connection timed out",
    "connect failure",
    "communication connection failure",
    "zero bytes were transmitted",
    "transport endpoint is not connected",
    "slurm temporarily unable",
    "resource temporarily unavailable",
    "slurm backup controller in standby",
    "munge",
    "authentication",
    "credential",
    "unable to establish",
    "could not establish",
    "slurm_persist_conn",
    "configless",
    "could not find slurm.conf",
    "unable to process configuration",
)

#: what the clients print for a job id the controller does not know (any more)
INVALID_JOB = "invalid job id specified"


@dataclass(frozen=True)
class CommandResult:
    """One finished client command."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def message(self) -> str:
        """The first meaningful line of the error output (or of stdout), for a reason."""
        for text in (self.stderr, self.stdout):
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            if lines:
                # sbatch prints the generic "submission failed: <why>" last: prefer it
                return lines[-1] if "submission failed" in lines[-1].lower() else lines[0]
        return f"exit status {self.returncode}"

    @property
    def unreachable(self) -> bool:
        """The controller did not answer (so nothing may be concluded)."""
        if self.ok:
            return False
        low = (self.stderr + "\n" + self.stdout).lower()
        return any(p in low for p in UNREACHABLE)

    @property
    def invalid_job(self) -> bool:
        return not self.ok and INVALID_JOB in self.stderr.lower()


#: how commands are run; tests substitute a function with the same signature
Runner = Callable[[Sequence[str], float, str | None], CommandResult]


def run_command(argv: Sequence[str], timeout: float, stdin: str | None = None) -> CommandResult:
    """Run one client command. A missing command answers 127; a timeout raises
    BackendUnavailable (the command may or may not have acted)."""
    args = tuple(argv)
    try:
        p = subprocess.run(
            args,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return CommandResult(args, 127, "", f"{args[0]}: command not found on PATH")
    except subprocess.TimeoutExpired:
        raise BackendUnavailable(
            f"did not answer within {timeout:.0f} s", obj=" ".join(args[:2])
        ) from None
    except OSError as e:
        return CommandResult(args, 126, "", f"{args[0]}: cannot run: {e}")
    return CommandResult(args, p.returncode, p.stdout, p.stderr)


def checked(result: CommandResult) -> CommandResult:
    """The result of a query, or BackendUnavailable when the query got no usable answer.

    An unknown job id is an answer (the caller looks at `invalid_job`); anything else
    that failed is not, whatever it says: a query failure never means "not found"."""
    if result.ok or result.invalid_job:
        return result
    raise BackendUnavailable(f"failed ({result.message})", obj=" ".join(result.argv[:1]) or "slurm")
