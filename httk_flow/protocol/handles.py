"""A job's handle: where its one marker is (state kind, placement, parsed marker name)."""

from __future__ import annotations

from dataclasses import dataclass

from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace


@dataclass(frozen=True, slots=True)
class JobHandle:
    """Where a job's marker is: its state kind, placement and parsed marker name."""

    state: State
    placement: str
    marker: Marker

    @property
    def key(self) -> str:
        return self.marker.key

    @property
    def job_id(self) -> str:
        return self.marker.job_id

    def path(self, ws: Workspace) -> str:
        return ws.marker_path(self.state, self.placement, self.marker)
