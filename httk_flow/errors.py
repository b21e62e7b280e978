"""The error root of httk_flow: every user-facing failure is a FlowError."""

from __future__ import annotations


class FlowError(Exception):
    """A failure a user can act on: what went wrong, with what, and what to do next."""

    #: exit status the CLI uses: 2 for bad usage or input, 1 for a failed operation
    exit_code: int = 1

    def __init__(self, message: str, *, obj: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.obj = obj
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.obj}: {self.message}" if self.obj else self.message
        return f"{text}; {self.hint}" if self.hint else text


class UsageError(FlowError):
    """Bad input from the user: a flag, a path, a job definition."""

    exit_code = 2


class WorkspaceError(FlowError):
    """The workspace is missing, of an unknown format, or damaged: fix the -w argument."""

    exit_code = 2


class InvalidName(UsageError):
    """A placement, tag, key, step or marker name that is not of the grammar."""


class InvalidJob(UsageError):
    """A job.json (or a submission line) that does not validate."""


class InvalidOutcome(FlowError):
    """An outcome.json that does not validate; the job fails with protocol_error."""


class CorruptRecord(FlowError):
    """A journal frame that cannot be read back."""


class TransitionConflict(FlowError):
    """The marker moved under us: another actor won the race."""


class IllegalTransition(FlowError):
    """A transition the state table forbids: always a bug or a hostile workspace."""


class UnsafePath(UsageError):
    """A symlink or foreign-owned entry where the protocol expects our own file."""


class JobNotFound(UsageError):
    """No job (or more than one) matches what the user named."""
