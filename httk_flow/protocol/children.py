"""Child jobs: ids derived from (parent, activation, label), placed inside the parent.

Deriving the id makes registration idempotent (a replayed commit creates nothing twice);
placing children under `<parent placement>/<parent key>` lets a join read every child's
state from one directory per state kind, whatever the number of children.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from httk_flow.protocol.discovery import markers_of_placement
from httk_flow.protocol.names import make_key
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

_NS = uuid.UUID("5b0d7c2e-8f3a-4c61-9e2d-6a1f0b9c4d17")


def child_id(parent_id: str, activation: int, label: str) -> str:
    return uuid.uuid5(_NS, f"{parent_id}/{activation}/{label}").hex


def child_placement(parent_placement: str, parent_key: str) -> str:
    return f"{parent_placement}/{parent_key}"


@dataclass(frozen=True)
class ChildState:
    label: str
    id: str
    key: str
    state: State | None  # None: no marker found (not registered, or damaged)
    path: str


def child_states(
    ws: Workspace,
    parent_placement: str,
    parent_key: str,
    parent_id: str,
    activation: int,
    labels: list[str],
    tags: dict[str, str | None] | None = None,
) -> list[ChildState]:
    """The current state of each labelled child, from one listing per state kind."""
    placement = child_placement(parent_placement, parent_key)
    # the last kind listed wins for a child seen twice (caught moving between two)
    found = {m.job_id: st for st, m in markers_of_placement(ws, placement)}
    out = []
    for label in labels:
        cid = child_id(parent_id, activation, label)
        tag = (tags or {}).get(label)
        key = make_key(cid, tag)
        out.append(ChildState(label, cid, key, found.get(cid), ws.job_dir(placement, key)))
    return out
