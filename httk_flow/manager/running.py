"""The records of this manager's own attempts: one running here, one whose commit waits
out a transient error, and one that ended."""

from __future__ import annotations

from dataclasses import dataclass

from httk_flow.manager.attempts import AttemptPlan
from httk_flow.manager.decide import Ending
from httk_flow.manager.launcher import LaunchedProcess
from httk_flow.manager.slots import Binding
from httk_flow.protocol.frames import Body
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle


@dataclass
class LocalAttempt:
    job: JobHandle
    spec: JobSpec
    body: Body  # of its running frame
    plan: AttemptPlan
    proc: LaunchedProcess
    started: float
    #: this host's monotonic clock when the gate opened: the limit and elapsed time count
    #: from it (a taker's new attempt starts its own)
    opened: float = 0.0
    #: seconds it may run (JobSpec.time_limit_after the snapshot's count), None: no limit
    limit: float | None = None
    term_at: float | None = None  # when we sent TERM (drain, cancel or time limit)
    interrupted: bool = False  # stopped by our drain: not charged to the job
    timed_out: bool = False  # stopped by us at its time limit: a charged failure
    binding: Binding | None = None  # the CPUs, GPUs and memory it holds here


@dataclass
class Pending:
    """An attempt whose commit (or, before launch, whose claim's release) failed for a
    reason that may pass (a full disk): retried with backoff, reported once."""

    la: LocalAttempt | None
    claimed: JobHandle
    spec: JobSpec
    body: Body  # of the claimed frame (a claim to release) or of the running frame
    ending: Ending | None  # None: a claim to give back, not a commit
    code: int | None = None
    sig: int | None = None
    next_at: float = 0.0
    delay: float = 0.5
    tries: int = 0


#: how long a cancellation's evidence waits for a KILLed process group to be gone
KILL_SETTLE = 2.0
#: backoff of a retried commit: doubling from half a second up to this
PENDING_DELAY_CAP = 30.0
#: a commit failing for a reason not known to pass is given up after this many tries
PENDING_PERMANENT_TRIES = 5


@dataclass(frozen=True)
class Finished:
    """An attempt that ended here, and where its job went (None: not committed by us)."""

    spec: JobSpec
    handle: JobHandle | None

    @property
    def state(self) -> State | None:
        return self.handle.state if self.handle else None
