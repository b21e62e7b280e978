"""The walltime fit: a manager claims only work whose declared time ends before the drain
it will actually get (the allocation's end less the drain and the batch system's early
signal margin), says how much usable time it has left, and `flow run` exits 4 when it
stops with work left that it could not do."""

from __future__ import annotations

import re
import time
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from httk_flow.manager.config import ALLOCATION_END_ENV, ManagerConfig
from httk_flow.protocol.states import State

from .support import Managers, flow, job, log_of, submit, write_script

#: a job that spawns one child which pauses itself, and joins it
PAUSING_CHILD = r"""
case "$FLOW_STEP" in
    main) publish '{"action":"wait","step":"collect","join":"all_succeeded"}' \
        '{"label":"c1","tag":"kid","step":"child"}' ;;
    child) publish '{"action":"pause","message":"look at me"}' ;;
    collect) publish '{"action":"succeed"}' ;;
esac
"""

#: fails its first attempt (a retry after a backoff), succeeds the next
FLAKY = """
if [ "$(bump main)" -eq 1 ]; then exit 1; fi
exit 0
"""

#: "HH:MM:SS MANAGER problem: stopped with work left: ..."
LEFT = re.compile(r"^\d\d:\d\d:\d\d \S+ problem: stopped with work left: (.*)$", re.M)


def left_line(text: str) -> str | None:
    found = LEFT.findall(text)
    assert len(found) <= 1, text
    return found[0] if found else None


# -- the usable end ---------------------------------------------------------------------


def test_the_usable_end_leaves_out_the_drain_and_the_margin_of_the_batch_system() -> None:
    def cfg(**kw: object) -> ManagerConfig:
        kw.setdefault("environ", {})
        return ManagerConfig.resolve(exit_when_idle=None, now=1000.0, **kw)  # type: ignore[arg-type]

    # Slurm ends the allocation at 2000, signals 2m before, and may do so 60 s early
    slurm = cfg(allocation=lambda: (2000.0, 60.0), drain_before="2m")
    assert (slurm.ends_at, slurm.drains_at) == (1820.0, 1880.0)
    assert (slurm.allocation_end, slurm.reserve) == (2000.0, 180.0)
    # the margin is a setting: the batch script passes it on
    assert cfg(allocation=lambda: (2000.0, 60.0), signal_margin="10s").ends_at == 1990.0
    # an end from the environment (the local backend: already less its drain) has none
    local = cfg(environ={ALLOCATION_END_ENV: "1500"})
    assert (local.ends_at, local.drains_at, local.reserve) == (1500.0, 1500.0, 0.0)
    # --walltime is this manager's own: it drains itself then, nothing comes early
    wall = cfg(walltime="5m", allocation=lambda: (2000.0, 60.0), drain_before="2m")
    assert (wall.ends_at, wall.drains_at) == (1300.0, 1300.0)
    assert cfg().ends_at is None and cfg().drains_at is None
    assert cfg(order="breadth").order == "breadth" and cfg().order == "depth"


def test_a_bad_margin_or_order_is_a_usage_error() -> None:
    from httk_flow.errors import UsageError

    with pytest.raises(UsageError, match="--signal-margin"):
        ManagerConfig.resolve(exit_when_idle=None, signal_margin="soon", environ={})
    with pytest.raises(UsageError, match="--order"):
        ManagerConfig.resolve(exit_when_idle=None, order="sideways", environ={})


def test_a_manager_in_an_allocation_claims_only_what_ends_before_the_earliest_drain(
    root: str, scripts: Path, managers: Managers
) -> None:
    """An allocation ending in 100 s that signals its drain 30 s before the end, up to
    30 s early: 40 s of usable time. A 60 s job fits the end, not the drain: left."""
    program = write_script(scripts, "ok.sh", "exit 0\n")
    [honest] = submit(root, program, time=60.0)
    [short] = submit(root, program, time=5.0)
    end = time.time() + 100
    p = managers.start(
        root,
        "--drain-before",
        "30s",
        "--signal-margin",
        "30s",
        command="serve",
        env={ALLOCATION_END_ENV: str(end)},
    )
    wait_for(lambda: job(root, short).state is State.SUCCEEDED or p.poll() is not None, 30)
    assert p.poll() is None, log_of(p)

    def beat() -> dict[str, object]:
        [m] = orjson.loads(flow("-w", root, "managers", "--json").stdout)["managers"]
        return dict(m)

    wait_for(lambda: beat()["attempts"] == 1, 15)  # a heartbeat every third of the lease
    m = beat()
    assert m["allocation_end"] == pytest.approx(end, abs=0.01)
    assert m["usable_end"] == m["ends_at"] == pytest.approx(end - 60, abs=0.01)
    assert m["drain_at"] == pytest.approx(end - 30, abs=0.01)
    assert 20 < float(m["usable_left"]) <= 40  # type: ignore[arg-type]
    text = flow("-w", root, "managers").stdout
    assert text.splitlines()[0].split() == [
        "ID",
        "HOST",
        "PID",
        "ALLOC",
        "STATE",
        "HEARTBEAT",
        "RUNNING",
        "IN",
        "USE",
        "USABLE",
        "ENDS",
        "POOLS",
    ]
    # ENDS: the allocation's end, a time of day (with the date past midnight)
    today = time.strftime("%Y-%m-%d") == time.strftime("%Y-%m-%d", time.localtime(end))
    ends = time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M", time.localtime(end))
    assert re.search(rf" 0/2 +0/\d+ CPUs +(2\d|3\d|40)s left +{ends} +default$", text, re.M), text
    time.sleep(1.5)  # a tick or two more: the 60 s job is still not claimed
    assert job(root, honest).state is State.READY
    assert job(root, honest).attempts == []
    p.terminate()
    assert p.wait(20) == 0, log_of(p)


# -- flow run: 0 when done, 4 when it stops with work left it could not do ----------------


def test_flow_run_exits_4_with_unfit_work_and_says_what_and_why(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "ok.sh", "exit 0\n")
    [long] = submit(root, program, time=3600.0)
    [short] = submit(root, program, time=1.0)
    t0 = time.monotonic()
    p = managers.start(root, "--walltime", "20s")  # --quiet: the line is said anyway
    assert p.wait(30) == 4, log_of(p)
    assert time.monotonic() - t0 < 15  # it does not sit out its walltime
    line = left_line(log_of(p))
    assert line is not None, log_of(p)
    assert re.fullmatch(
        r"1 ready job needs 1h but this manager had (1\d|20)s left \(give managers more time: "
        r"a longer --walltime or allocation\)",
        line,
    ), line
    assert job(root, long).state is State.READY
    assert job(root, short).state is State.SUCCEEDED


def test_flow_run_exits_4_with_paused_work_and_blocked_joins(
    root: str, scripts: Path, managers: Managers
) -> None:
    [parent] = submit(root, write_script(scripts, "family.sh", PAUSING_CHILD))
    p = managers.start(root)
    assert p.wait(30) == 4, log_of(p)
    assert left_line(log_of(p)) == (
        "1 paused job (`flow resume` continues it); 1 waiting job whose children cannot finish here"
    )
    assert job(root, parent).state is State.WAITING
    r = flow("-w", root, "resume", "kid")
    assert r.returncode == 0, r.stderr
    # the child now pauses again (its program says so): still work left
    assert managers.run(root) == 4


def test_flow_run_exits_0_when_all_is_done_and_waits_out_a_backoff(
    root: str, scripts: Path, managers: Managers
) -> None:
    [flaky] = submit(root, write_script(scripts, "flaky.sh", FLAKY))
    submit(root, write_script(scripts, "ok.sh", "exit 0\n"), count=3, time=2.0)
    p = managers.start(root, "--walltime", "1m")
    assert p.wait(30) == 0, log_of(p)
    assert left_line(log_of(p)) is None
    assert job(root, flaky).state is State.SUCCEEDED
    assert len(job(root, flaky).attempts) == 2


def test_a_failure_outranks_work_left(root: str, scripts: Path, managers: Managers) -> None:
    submit(root, write_script(scripts, "bad.sh", "exit 3\n"), retries=0)
    submit(root, write_script(scripts, "ok.sh", "exit 0\n"), time=3600.0)
    p = managers.start(root, "--walltime", "30s")
    assert p.wait(30) == 1, log_of(p)
    assert left_line(log_of(p)) is not None  # still said
