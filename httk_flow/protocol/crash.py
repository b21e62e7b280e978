"""Named crash points: a test sets FLOW_CRASH_AT=<point>[:<nth>] and the process dies there.

The points sit between two durable steps of the protocol, so crash tests need no
monkeypatching: they prove that whatever survives the SIGKILL converges.
"""

from __future__ import annotations

import os
import signal

from httk_flow.protocol.layout import ENV_CRASH_AT

_spec = os.environ.get(ENV_CRASH_AT, "")
_point, _, _nth = _spec.partition(":")
_remaining = int(_nth) if _nth.isdigit() else 1

#: every crash point the core defines, in protocol order (the crash-point tests iterate this)
POINTS = (
    "submit.after_payload",
    "submit.after_journal",
    "transition.after_journal",
    "transition.after_rename",
    "claim.after_claim",
    "launch.after_spawn",
    "launch.after_running",
    "commit.after_committing",
    "commit.after_children",
    "commit.after_tidy",
    "commit.after_final",
    "commit.after_direct",
    "join.after_release",
    "cancel.after_fence",
    "cancel.after_signal",
    "request.after_claim",
    "request.after_apply",
    "after.before_count",
    "after.after_count",
    "after.after_decide",
    "after.before_released",
)


def crash_point(name: str) -> None:
    """Die here with SIGKILL when FLOW_CRASH_AT names this point (on its nth hit)."""
    global _remaining
    if _point != name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
