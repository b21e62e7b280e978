"""Managers whose clocks are hours off, beside live ones: they take over no live work, they
do recover dead work, and the not-before times they write are in the shared filesystem's
clock (docs/protocol.md §8).

The skewed managers run with libfaketime preloaded (the `faketime` command tells where the
library is; the manager is started with its environment directly, since the command's
child would outlive a kill of the command). libfaketime shifts time.time(), time.monotonic()
and utime(NULL), but not the stamps the kernel gives a new file, nor stat().
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import (
    JobInfo,
    ManagerProcess,
    Managers,
    beats,
    dump,
    log_of,
    make_workspace,
    submit,
    write_script,
)

from httk_flow.protocol.procs import group_members_alive
from httk_flow.protocol.states import State

from .support import job_now

LEASE = "1s"  # takeover after 2 s of silence (the default takeover factor)
GRACE = 2.0
SKEW = 2 * 3600.0

#: the first attempt runs long (and says so); every later attempt ends at once
LONG_FIRST = r"""
echo "$FLOW_ATTEMPT_ID" >> "$FLOW_JOB_DIR/runs"
if [ "$FLOW_ATTEMPT_ID" = a0001 ]; then
    touch "$FLOW_JOB_DIR/started"
    sleep 120
fi
exit 0
"""

#: the first attempt fails (a process failure, retried under --retries 1)
FAIL_FIRST = r"""
echo "$FLOW_ATTEMPT_ID" >> "$FLOW_JOB_DIR/runs"
[ "$FLOW_ATTEMPT_ID" = a0001 ] && exit 1
exit 0
"""

#: the clock the process sees, and the stamp the filesystem gives a file it creates
PROBE = (
    "import json, os, sys, time\n"
    "p = sys.argv[1]\n"
    "open(p, 'xb').close()\n"
    "print(json.dumps({'time': time.time(), 'fs': os.stat(p).st_mtime}))\n"
    "os.unlink(p)\n"
)


def faketime_env(offset: str, tmp: Path) -> dict[str, str]:
    """The environment that runs a process under libfaketime shifted by `offset` (+2h).

    Fails when faketime is missing on CI (CI=true: .ci/run installs it); skips elsewhere."""
    exe = shutil.which("faketime")
    if exe is None:
        why = "needs libfaketime's `faketime` command (Debian package faketime)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    # `faketime -f +2h env` once exited 1 in a clean-clone CI run and never since, by hand
    # or in 40 runs (its stderr was not kept): a few tries, and what it said if all fail
    for _ in range(5):
        got = subprocess.run([exe, "-f", offset, "env"], capture_output=True, text=True, timeout=30)
        if got.returncode == 0:
            break
    else:
        raise AssertionError(f"faketime -f {offset} env failed: {got.stderr}")
    out = got.stdout
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    # FAKETIME_SHARED names the command's own shared memory, gone once it exits
    env = {k: seen[k] for k in ("LD_PRELOAD", "FAKETIME") if k in seen}
    probe = tmp / f"probe{offset}"
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(probe)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=30,
    )
    clock = orjson.loads(r.stdout) if r.returncode == 0 else {}
    sign = -1 if offset.startswith("-") else 1
    if not clock or abs(clock["time"] - clock["fs"] - sign * SKEW) > 60:
        pytest.fail(f"faketime does not shift the clock as expected: {env} -> {r}")
    return env


def fs_now(root: str) -> float:
    """The filesystem's time now: the stamp of a file created just now."""
    p = Path(root) / ".flow" / "tmp" / f"test-probe.{os.getpid()}"
    p.touch(exist_ok=False)
    try:
        return p.stat().st_mtime
    finally:
        p.unlink()


def lived_through_takeover_graces(root: str, procs: list[ManagerProcess]) -> None:
    """Wait until each of `procs` has heartbeated 15 times: at least 14 thirds of its lease
    (4.7 s), more than twice the takeover grace it would need to take anything over."""
    wait_for(lambda: all(beats(root, p) >= 15 for p in procs), 60)
    for p in procs:
        assert p.poll() is None, log_of(p)


def untouched(root: str, jids: list[str], owner: str) -> None:
    """Every job still runs its first attempt under `owner`; nothing took it over."""
    for jid in jids:
        info = job_now(root, jid)
        assert info.state is State.RUNNING, dump(root, [jid])
        assert info.last["attempt"]["manager"] == owner, dump(root, [jid])
        assert not [f for f in info.frames if "evidence" in f], dump(root, [jid])
        assert (info.job_dir(root) / "runs").read_text().split() == ["a0001"]


def evidence(info: JobInfo) -> list[dict[str, object]]:
    return [f["evidence"] for f in info.frames if "evidence" in f]


def long_jobs(
    root: str,
    scripts: Path,
    managers: Managers,
    n: int,
    *,
    pool: str | None = None,
    host: str | None = None,
) -> tuple[list[str], ManagerProcess, str]:
    """`n` jobs running their long first attempt under one plain manager (lease 1 s)."""
    prog = write_script(scripts, "long.sh", LONG_FIRST)
    jids = submit(root, prog, count=n, workdir="isolated", pool=pool)
    pools = ("--pool", pool) if pool else ()
    live = managers.start(root, "--lease", LEASE, *pools, command="serve", workers=n, host=host)
    started = [job_now(root, j).job_dir(root) / "started" for j in jids]
    wait_for(lambda: all(s.exists() for s in started) or live.poll() is not None, 30)
    assert live.poll() is None, log_of(live)
    owner = job_now(root, jids[0]).last["attempt"]["manager"]
    assert all(job_now(root, j).last["attempt"]["manager"] == owner for j in jids)
    return jids, live, owner


def says_ages_unused(p: ManagerProcess) -> bool:
    return "heartbeat ages are not used" in log_of(p)


def test_managers_hours_ahead_and_behind_leave_live_work_on_their_host_alone(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    ahead, behind = faketime_env("+2h", tmp_path), faketime_env("-2h", tmp_path)
    jids, live, owner = long_jobs(root, scripts, managers, 4)
    skewed = [
        managers.start(root, "--lease", LEASE, command="serve", env=env) for env in (ahead, behind)
    ]
    lived_through_takeover_graces(root, skewed)
    for p in skewed:
        assert says_ages_unused(p), log_of(p)
    untouched(root, jids, owner)
    assert live.poll() is None, log_of(live)

    # once the live manager is really gone, the skewed ones kill its orphans and recover
    attempts = [job_now(root, j).last["attempt"] for j in jids]
    live.kill()
    live.wait()
    wait_for(lambda: all(evidence(job_now(root, j)) for j in jids), GRACE + 10)
    for jid, att in zip(jids, attempts, strict=True):
        [proof] = evidence(job_now(root, jid))[:1]
        assert proof["owner"] == owner and proof["evidence"] == "process_gone", proof
        assert not group_members_alive(att["pgid"]), att
    wait_for(lambda: all(job_now(root, j).state is State.SUCCEEDED for j in jids), 30)
    for p in skewed:
        assert p.poll() is None, log_of(p)


@pytest.mark.parametrize("offset", ["+2h", "-2h"])
def test_a_manager_hours_off_on_another_host_recovers_dead_work_and_never_live_work(
    root: str, scripts: Path, managers: Managers, tmp_path: Path, offset: str
) -> None:
    env = faketime_env(offset, tmp_path)
    jids, live, owner = long_jobs(root, scripts, managers, 2, host="node-a")
    skewed = managers.start(root, "--lease", LEASE, command="serve", env=env, host="node-b")
    lived_through_takeover_graces(root, [skewed])
    assert says_ages_unused(skewed), log_of(skewed)
    untouched(root, jids, owner)

    # another host's process cannot be seen: only its heartbeat, seen to stop changing
    live.kill()
    live.wait()
    wait_for(lambda: all(evidence(job_now(root, j)) for j in jids), GRACE + 10)
    for jid in jids:
        proof = evidence(job_now(root, jid))[0]
        assert proof["owner"] == owner and proof["evidence"] == "lease_expired", proof
    wait_for(lambda: all(job_now(root, j).state is State.SUCCEEDED for j in jids), 30)
    assert skewed.poll() is None, log_of(skewed)


def test_a_retry_committed_by_a_manager_hours_ahead_is_due_in_the_filesystems_clock(
    scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    backoff = 4.0
    root = make_workspace(tmp_path / "slow-backoff", backoff_base=backoff, backoff_cap=backoff)
    ahead = faketime_env("+2h", tmp_path)
    jids = submit(root, write_script(scripts, "flaky.sh", FAIL_FIRST), count=3, retries=1)
    skewed = managers.start(root, "--lease", LEASE, command="serve", env=ahead, workers=3)

    def in_backoff() -> list[int] | None:
        infos = [job_now(root, j) for j in jids]
        ready = [i for i in infos if i.state is State.READY and i.handle.marker.not_before]
        return [i.handle.marker.not_before for i in ready] if len(ready) == len(jids) else None

    not_before = wait_for(in_backoff, 30)
    now = fs_now(root)
    assert isinstance(not_before, list)
    for nb in not_before:
        # rounded up to a whole second, counted from a commit a moment ago
        assert now - 1 <= nb <= now + backoff + 1, (nb - now, dump(root))
    skewed.terminate()
    assert skewed.wait(30) == 0, log_of(skewed)
    # a manager with a right clock runs the retries once they are due, not hours later
    assert managers.run(root, "--lease", LEASE, timeout=backoff + 30) == 0
    for jid in jids:
        info = job_now(root, jid)
        assert info.state is State.SUCCEEDED, dump(root, [jid])
        assert (info.job_dir(root) / "runs").read_text().split() == ["a0001", "a0002"]
