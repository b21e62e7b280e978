"""The dependency sweeps: what a process that died mid-way left of counting an end or
releasing a decided set is finished here. The ends themselves are counted where they
happen (protocol/release.py, from every transition), so this pass only catches up."""

from __future__ import annotations

import time

from httk_flow.errors import FlowError
from httk_flow.manager.passes import PassContext
from httk_flow.protocol.release import sweep_ends, sweep_sets

#: seconds between two looks at the decided sets (one listing of .flow/after)
SETS_EVERY = 30.0
#: seconds between two looks for ends that were never counted (one listing of .flow/watch,
#: then one listing per terminal state kind of each placement holding a watched job)
ENDS_EVERY = 120.0


class DependencyPass:
    """Both sweeps, the first at once: a manager started after a crash catches up."""

    def __init__(self, ctx: PassContext) -> None:
        self.ctx = ctx
        self._next_sets = 0.0
        self._next_ends = 0.0

    def run(self) -> int:
        now = time.monotonic()
        n = 0
        try:
            if now >= self._next_ends:
                self._next_ends = now + ENDS_EVERY
                n += sweep_ends(self.ctx.ws, actor=self.ctx.actor)
            if now >= self._next_sets:
                self._next_sets = now + SETS_EVERY
                n += sweep_sets(self.ctx.ws, actor=self.ctx.actor)
        except FlowError as e:
            self.ctx.report_once("dependencies", e.render())
        return n
