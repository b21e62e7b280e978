"""`flow managers`, `flow lock`, `flow unlock`."""

from __future__ import annotations

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.ops.managers import clock, look
from httk_flow.protocol import maintenance
from httk_flow.protocol.durations import compact_duration, format_duration
from httk_flow.protocol.leases import Liveness
from httk_flow.protocol.resources import Offer, format_size


@click.command("managers")
@click.option("--all", "all_", is_flag=True, help="Include managers that stopped or died long ago.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def managers(app: App, /, all_: bool, as_json: bool) -> None:
    """Managers with heartbeat age and liveness, the jobs a dead one still holds, the
    allocation each runs in and how much usable time each has left."""
    seen = look(app.ws)
    rows = seen.views(all_=all_)
    now = seen.now

    def left(m: Liveness) -> float | None:
        return m.info.usable_left(now) if m.alive else 0.0

    if as_json:
        app.json(
            {
                "managers": [
                    {
                        "id": m.info.id,
                        "host": m.info.host,
                        "pid": m.info.pid,
                        "alive": m.alive,
                        "state": v.state,
                        "heartbeat_age": round(m.age, 2),
                        "stopped": m.stopped,
                        "workers": m.info.workers,
                        "running": v.running,
                        "holds": None if v.holds is None else v.held,
                        "draining": m.info.draining,
                        "pools": list(m.info.pools),
                        "capabilities": list(m.info.capabilities),
                        "allocation": (
                            {"backend": v.allocation[0], "id": v.allocation[1]}
                            if v.allocation is not None
                            else None
                        ),
                        "ends_at": m.info.ends_at,
                        "usable_end": m.info.ends_at,
                        "usable_left": _round(left(m)),
                        "drain_at": m.info.drain_at,
                        "allocation_end": m.info.allocation_end,
                        "attempts": m.info.attempts,
                        "inventory": m.info.inventory.to_json() if m.info.inventory else None,
                        "in_use": m.info.in_use.to_json() if m.info.in_use else None,
                    }
                    for v in rows
                    for m in (v.liveness,)
                ]
            }
        )
        return
    app.table(
        [
            "ID",
            "HOST",
            "PID",
            "ALLOC",
            "STATE",
            "HEARTBEAT",
            "RUNNING",
            "IN USE",
            "USABLE",
            "ENDS",
            "POOLS",
        ],
        [
            [
                m.info.id,
                m.info.host,
                m.info.pid,
                ":".join(v.allocation) if v.allocation is not None else "-",
                v.state,
                f"{format_duration(m.age)} ago",
                f"{v.running}/{m.info.workers}",
                _in_use(m.info.inventory, m.info.in_use) if m.alive else "-",
                _usable(left(m)),
                clock(v.ends, now) if v.ends is not None else "-",
                ",".join(m.info.pools) or "default",
            ]
            for v in rows
            for m in (v.liveness,)
        ],
    )


def _in_use(has: Offer | None, used: Offer | None) -> str:
    """What attempts hold of the inventory: `3/4 CPUs, 1/2 GPUs, 4G/16G`."""
    if has is None:
        return "-"
    u = used or Offer(0)
    parts = [f"{u.cpus}/{has.cpus} CPUs"]
    if has.gpus:
        parts.append(f"{len(u.gpus)}/{len(has.gpus)} GPUs")
    if u.mem:
        parts.append(f"{format_size(u.mem)}/{format_size(has.mem)}")
    used_custom = dict(u.custom)
    parts += [f"{k} {used_custom.get(k, 0)}/{n}" for k, n in has.custom]
    return ", ".join(parts)


def _round(v: float | None) -> float | None:
    return round(v, 1) if v is not None else None


def _usable(left: float | None) -> str:
    """Claimable time left: `-` for a manager with no end, else e.g. `1h30m left`."""
    return "-" if left is None else f"{compact_duration(left)} left"


def _lock_doc(held: maintenance.MaintenanceLock) -> dict[str, object]:
    return {
        "user": held.user,
        "host": held.host,
        "since": held.since,
        "reason": held.reason,
        "stale": held.stale,
    }


@click.command("lock")
@click.option("--reason", default="", help="Shown to everyone who looks.")
@click.option("--json", "as_json", is_flag=True, help="Print the lock as a JSON document.")
@workspace_option
@click.pass_obj
def lock(app: App, /, reason: str, as_json: bool) -> None:
    """Take the maintenance lock: managers launch nothing new while it is held."""
    held = maintenance.acquire(app.ws, reason)
    if as_json:
        app.json({"lock": _lock_doc(held)})
        return
    # described as of the moment it was taken: the age is 0.0s, however slow the write
    app.echo(
        f"maintenance lock taken ({held.describe(now=held.since)}); release it with `flow unlock`"
    )


@click.command("unlock")
@click.option("--json", "as_json", is_flag=True, help="Print whether a lock was released.")
@workspace_option
@click.pass_obj
def unlock(app: App, /, as_json: bool) -> None:
    """Release the maintenance lock."""
    released = maintenance.release(app.ws)
    if as_json:
        app.json({"released": released})
    elif released:
        app.echo("maintenance lock released")
    else:
        app.echo("no maintenance lock was held")
