"""The maintenance lock as a running manager sees it, and `flow status`/`flow managers`
explaining what a live manager does and does not serve."""

from __future__ import annotations

import getpass
import os
import socket
import time
from pathlib import Path

import orjson
from helpers import wait_for
from manager.support import Managers, beats, log_of

from httk_flow.protocol import layout

from .support import Flow, holds_until, wait_state

NO_MANAGER = "no live manager; start one with `flow serve` or `flow run`"


#: how long ago the lock of these tests was taken: its record is backdated so (see
#: backdate_lock), and the age reads as every age of the CLI does (5h10m, 4m12s, 8.4s)
TAKEN_AGO = 5 * 3600 + 10 * 60
AGE = "5h10m"


def lock_reason(text: str, verb: str = "held", age: str = AGE) -> str:
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    return f"maintenance lock {verb} (by {who}, {age} ago: {text}); release it with `flow unlock`"


def backdate_lock(flow: Flow, seconds: float = TAKEN_AGO) -> None:
    """Make the held lock `seconds` old (its `since`), as one taken that long ago is;
    its age then reads the same for the minute that follows."""
    path = Path(layout.maintenance_file(flow.root))
    doc = orjson.loads(path.read_bytes())
    doc["since"] = time.time() - seconds
    path.write_bytes(orjson.dumps(doc))


def counts(flow: Flow) -> dict[str, int]:
    return {k: v for k, v in flow.json("status")["counts"].items() if v}


def test_while_the_lock_is_held_a_running_manager_launches_nothing(
    flow: Flow, managers: Managers
) -> None:
    taken = flow.ok("lock", "--reason", "upgrade")
    assert taken == lock_reason("upgrade", "taken", age="0.0s") + "\n"
    p = managers.start(flow.root, "--lease", "1s", command="serve", workers=2)
    for t in ("a", "b"):
        flow.submit("--tag", t, "true")
    wait_for(lambda: counts(flow) == {"ready": 2} or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    # the manager ticks (its loop heartbeats six more times: 5 thirds of its 1 s lease,
    # passes over the two ready jobs), and claims nothing
    start = beats(flow.root, p)
    holds_until(
        lambda: counts(flow) == {"ready": 2},
        lambda: beats(flow.root, p) >= start + 6 or p.poll() is not None,
        timeout=60,
    )
    assert p.poll() is None, log_of(p)
    backdate_lock(flow)
    status = flow.json("status")
    assert status["blocked"] == [{"reason": lock_reason("upgrade"), "count": 2}]
    assert [m["alive"] for m in status["managers"]] == [True]
    assert f"blocked: 2 jobs: {lock_reason('upgrade')}" in flow.ok("status").splitlines()

    assert flow.ok("unlock") == "maintenance lock released\n"
    for t in ("a", "b"):
        wait_state(flow, t, {"succeeded"}, timeout=10)
    assert flow.json("status")["blocked"] == []
    assert flow.ok("unlock") == "no maintenance lock was held\n"
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_the_locks_age_reads_as_every_age_of_the_cli(flow: Flow) -> None:
    """Minutes, hours, days (format_duration), in the refusal of a second lock; a lock
    older than a day is also called stale."""
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    flow.ok("lock", "--reason", "swap")
    for seconds, age in (
        (252, "4m12s"),
        (TAKEN_AGO, AGE),
        (20 * 3600, "20h00m"),
        (3 * 86400 + 120, "3d00h"),
    ):
        backdate_lock(flow, seconds)
        stale = " — stale, check whether it is still needed" if seconds > 86400 else ""
        r = flow("lock")
        assert (r.exit_code, r.stdout, r.stderr) == (
            2,
            "",
            f"flow: error: the maintenance lock: is already held (by {who}, {age} ago: swap"
            f"{stale}); release it with `flow unlock` first\n",
        )


def test_status_plain_without_a_manager_names_every_blocker(flow: Flow, managers: Managers) -> None:
    flow.submit("--tag", "q", "true")
    assert managers.run(flow.root, "--pool", "nowhere") == 0  # registers it, serves nothing
    flow.ok("lock", "--reason", "disk swap")
    backdate_lock(flow)
    assert flow.ok("status") == (
        f"workspace {flow.root}: 1 jobs\n"
        "STATE      JOBS\n"
        "ready      1\n"
        "running    0\n"
        "succeeded  0\n"
        "failed     0\n"
        "managers: 0 live\n"
        f"blocked: 1 job: {lock_reason('disk swap')}\n"
        f"blocked: 1 job: {NO_MANAGER}\n"
    )


def test_status_names_the_pool_no_live_manager_serves_and_groups_counts(
    flow: Flow, managers: Managers
) -> None:
    a1 = flow.submit("--tag", "a", "true")
    a2 = flow.submit("--tag", "a", "--placement", "campaign/x", "true")
    gpu = flow.submit("--tag", "b", "--pool", "gpu", "--placement", "campaign/x", "true")
    p = managers.start(flow.root, "--lease", "3s", command="serve", workers=2)
    wait_for(lambda: counts(flow) == {"ready": 1, "succeeded": 2} or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)

    status = flow.json("status")
    assert status["blocked"] == [
        {
            "reason": "no live manager serves pool `gpu`; start one with `flow serve --pool gpu`",
            "count": 1,
        }
    ]
    [m] = status["managers"]
    assert set(m) >= {"id", "host", "pid", "alive", "heartbeat_age"}
    assert (m["host"], m["pid"], m["alive"]) == (socket.gethostname(), p.pid, True)
    assert 0 <= m["heartbeat_age"] < 3
    assert flow.json("status", "--by", "tag")["groups"] == {
        "a": {"succeeded": 2},
        "b": {"ready": 1},
    }
    assert flow.json("status", "--by", "placement")["groups"] == {
        a1["placement"]: {"succeeded": 1},
        "campaign/x": {"ready": 1, "succeeded": 1},
    }
    assert a2["placement"] == gpu["placement"] == "campaign/x"

    [live] = flow.json("managers")["managers"]
    assert live["id"] == m["id"] and live["alive"] is True and not live["stopped"]
    assert (live["pid"], live["workers"], live["pools"]) == (p.pid, 2, [])
    assert 0 <= live["heartbeat_age"] < 3
    assert (Path(flow.root) / ".flow" / "managers" / m["id"] / "heartbeat.json").is_file()

    p.terminate()
    assert p.wait(10) == 0, log_of(p)
    assert flow.json("managers")["managers"] == []
    [gone] = flow.json("managers", "--all")["managers"]
    assert (gone["id"], gone["alive"], gone["stopped"]) == (m["id"], False, True)
    status = flow.json("status")
    assert status["managers"] == [] and status["blocked"] == [{"reason": NO_MANAGER, "count": 1}]
    assert os.path.exists(Path(flow.root) / ".flow" / "managers" / m["id"] / "stopped")
