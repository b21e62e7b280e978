"""Job state kinds and the one table of transitions between them."""

from __future__ import annotations

import enum

from httk_flow.errors import IllegalTransition


class State(enum.Enum):
    """Where a job is; the directory its marker lives in under .flow/state/."""

    SUBMITTED = "submitted"
    READY = "ready"
    CLAIMED = "claimed"
    RUNNING = "running"
    COMMITTING = "committing"
    WAITING = "waiting"
    PAUSED = "paused"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """No manager acts on the job any more (failed may still be resumed by an operator)."""
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        """A manager owns the job through a lease (an attempt exists or is being made)."""
        return self in _ACTIVE

    @property
    def is_permanent(self) -> bool:
        """Nothing, not even an operator, moves the job out of this state."""
        return not TRANSITIONS[self]

    def check(self, target: State) -> None:
        """Raise IllegalTransition unless self -> target is in the table."""
        if target not in TRANSITIONS[self]:
            raise IllegalTransition(f"transition {self.value} -> {target.value} is not allowed")


_TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
_ACTIVE = frozenset({State.CLAIMED, State.RUNNING, State.COMMITTING, State.CANCELLING})

S = State
#: every legal move; verified_transition checks each rename against it
TRANSITIONS: dict[State, frozenset[State]] = {
    # submitted -> submitted: a priority change before registration; -> paused: a held
    # job's registration, or a pause before registration (both validate job.json first);
    # -> waiting: a job registered while its dependencies are not met
    S.SUBMITTED: frozenset({S.SUBMITTED, S.READY, S.WAITING, S.PAUSED, S.FAILED, S.CANCELLED}),
    # ready -> ready: a priority change is a rename too
    S.READY: frozenset({S.READY, S.CLAIMED, S.PAUSED, S.CANCELLED, S.FAILED}),
    S.CLAIMED: frozenset({S.RUNNING, S.READY, S.FAILED, S.CANCELLED}),
    # running -> succeeded: the direct commit of a plain success by the attempt's manager
    S.RUNNING: frozenset({S.COMMITTING, S.CANCELLING, S.READY, S.SUCCEEDED}),
    # committing -> committing: a manager takes over a commit whose owner is gone
    S.COMMITTING: frozenset({S.COMMITTING, S.READY, S.WAITING, S.PAUSED, S.SUCCEEDED, S.FAILED}),
    S.WAITING: frozenset({S.WAITING, S.READY, S.FAILED, S.PAUSED, S.CANCELLED}),
    # paused -> waiting: a join paused by an operator goes back to waiting on resume
    # paused -> failed: a paused job whose dependency failed (--after-policy fail)
    S.PAUSED: frozenset({S.PAUSED, S.READY, S.WAITING, S.FAILED, S.CANCELLED}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.FAILED: frozenset({S.READY, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.CANCELLED: frozenset(),
}
del S


def ends_commit(source: State | None, target: State) -> bool:
    """Whether a move is the end of an attempt's commit: committing -> anything but
    committing, or the direct commit running -> succeeded (protocol.md §10)."""
    if source is State.COMMITTING:
        return target is not State.COMMITTING
    return source is State.RUNNING and target is State.SUCCEEDED
