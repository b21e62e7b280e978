"""Launching ahead: while every worker runs a short attempt, the next jobs wait claimed,
their launchers already started and blocked at their closed gates.

A worker that frees then costs one rename and a write to a gate instead of a process
start, which the manager would otherwise wait for (posix_spawn returns once the child
has exec'd its launcher). Nothing of the protocol changes: such a job is claimed, its
program has not run, and its gate opens only after the claimed -> running rename, as for
any launch (docs/protocol.md §9). It is done only while attempts end quickly, so that a
job never waits long behind another manager's free worker, and a job that waits longer
than MAX_WAIT all the same (a long attempt came) goes back to ready, uncharged.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from httk_flow.errors import TransitionConflict
from httk_flow.manager.attempts import AttemptPlan
from httk_flow.manager.claim import Sort
from httk_flow.manager.launcher import LaunchedProcess
from httk_flow.manager.slots import Binding
from httk_flow.protocol.frames import Body
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, transition
from httk_flow.protocol.workspace import Workspace

#: an attempt whose program ends this soon after its gate opened counts as short
SHORT = 1.0
#: seconds a job launched ahead may wait for a worker before its claim goes back
MAX_WAIT = 5.0


@dataclass
class Gated:
    """An attempt claimed and launched behind its closed gate: its program has not run."""

    claimed: JobHandle
    spec: JobSpec
    body: Body  # of the claimed frame
    plan: AttemptPlan
    proc: LaunchedProcess
    #: the resources it holds; launched ahead, it takes them when a worker frees
    binding: Binding | None
    #: this host's monotonic clock at its launch (0: launched for a worker free then)
    since: float = 0.0
    #: its place in the claim order when it was claimed
    sort: Sort = (0, 0, 0)

    @property
    def ahead(self) -> bool:
        return self.since > 0.0

    def close_unopened(self) -> None:
        """End the launcher at its closed gate: the program never runs."""
        self.proc.close_gate()
        self.proc.wait()
        self.proc.close()
        if self.ahead:
            # nothing ran: what the launcher made says nothing, and the next attempt has
            # its own number (a persistent run/ is the job's, not the attempt's)
            shutil.rmtree(self.plan.dir, ignore_errors=True)

    def give_back(self, ws: Workspace, actor: str, why: str) -> None:
        """Close it unopened and its claim goes back to ready, uncharged (nothing to give
        back if it was cancelled meanwhile); raises FlowError when the rename fails."""
        self.close_unopened()
        try:
            transition(ws, self.claimed, State.READY, self.body.released(why), actor=actor)
        except TransitionConflict:
            pass


class LaunchAhead:
    """Which jobs wait launched ahead, and whether to launch more.

    Only while each of the last `workers` attempts ended within SHORT seconds (and,
    depth-first, without making its job ready again for a next step), only for
    jobs that ask for the default resources (their CPU is named at the gate, as it is
    chosen when a worker frees) and only on a manager without GPUs, whose device
    variables would have to be chosen at the launch."""

    def __init__(self, workers: int, *, enabled: bool = True, depth_first: bool = True) -> None:
        self.workers = workers
        self.enabled = enabled
        self.depth_first = depth_first
        #: oldest first
        self.gated: list[Gated] = []
        #: attempts in a row that ended short
        self._short = 0

    def __len__(self) -> int:
        return len(self.gated)

    def ended(self, elapsed: float, *, continues: bool = False) -> None:
        """One of our attempts ended, `elapsed` seconds after its gate opened. `continues`:
        its commit made the job ready again (an advance, a retry): depth-first, that job
        comes before any other, so none is launched ahead of it (claim.py's order)."""
        if elapsed < SHORT and not (continues and self.depth_first):
            self._short += 1
        else:
            self._short = 0

    def room(self, running: int) -> int:
        """How many more jobs to launch ahead now, with `running` workers busy."""
        if not self.enabled or running < self.workers or self._short < self.workers:
            return 0
        return max(0, self.workers - len(self.gated))

    def stale(self, now: float) -> list[Gated]:
        """Take out the jobs that have waited MAX_WAIT (`now`: the monotonic clock)."""
        old = [g for g in self.gated if now - g.since >= MAX_WAIT]
        if old:
            self.gated = [g for g in self.gated if now - g.since < MAX_WAIT]
            self._short = 0  # the attempts under way are not short: launch none ahead
        return old

    def take_all(self) -> list[Gated]:
        out, self.gated = self.gated, []
        return out
