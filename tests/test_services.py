"""services: the one rule of who serves a job (the claim pass's), pinned."""

from __future__ import annotations

import pytest

from httk_flow.protocol.leases import ManagerInfo
from httk_flow.protocol.services import ServiceClass

NO_POOL: tuple[str, ...] = ()


@pytest.mark.parametrize(
    ("pool", "requires", "pools", "caps", "served"),
    [
        # a job without a pool is in the default pool
        (None, (), NO_POOL, (), True),
        (None, (), ("default",), (), True),
        (None, (), ("gpu",), (), False),
        # naming the default pool is the same as naming none
        ("default", (), NO_POOL, (), True),
        ("default", (), ("default",), (), True),
        ("default", (), ("gpu",), (), False),
        # a named pool is served only by a manager offering it
        ("gpu", (), NO_POOL, (), False),
        ("gpu", (), ("gpu",), (), True),
        ("gpu", (), ("default", "gpu"), (), True),
        # capabilities: every required one must be offered
        ("gpu", ("cuda",), ("gpu",), (), False),
        ("gpu", ("cuda",), ("gpu",), ("cuda",), True),
        ("gpu", ("cuda", "big"), ("gpu",), ("cuda",), False),
        ("gpu", ("cuda",), NO_POOL, ("cuda",), False),
        (None, ("cuda",), NO_POOL, ("cuda", "big"), True),
    ],
)
def test_who_serves_a_job(
    pool: str | None,
    requires: tuple[str, ...],
    pools: tuple[str, ...],
    caps: tuple[str, ...],
    served: bool,
) -> None:
    assert ServiceClass(pool, requires).served_by(pools, caps) is served
    # a heartbeat reader applies the same rule
    info = ManagerInfo("m1", "h", 1, 0.0, pools=pools, capabilities=caps)
    assert info.serves(pool, requires) is served
